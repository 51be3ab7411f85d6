"""One request that breaks the model runner fails alone (``Engine._run``).

The batch is run again piece by piece: the failing piece's request fails with
the runner's error and gives back what it held, and every other request gets
exactly what it would have got had the failing one never been there (the model
is batch-invariant and each sampler is rewound). A runner that fails on every
batch of one request takes that request alone, and the loop goes on.
"""

from __future__ import annotations

import pytest
from test_engine import GREEDY, drain_and_flush, make_engine, words

from kvwatch.engine import SamplingParams
from kvwatch.engine.request import Status

SAMPLED = SamplingParams(max_tokens=12, temperature=1.0, seed=7)


def breaking(engine, bad: str):
    """Make the engine's runner raise on any batch that holds ``bad``."""
    runner = engine._runner
    real = runner.run

    def run(works):
        if any(w.request.id == bad for w in works):
            raise IndexError("index 0 is out of bounds for axis 0 with size 0")
        return real(works)

    runner.run = run


def finish(engine, ids):
    while engine.has_unfinished():
        engine.step()
    return {rid: engine.take(rid) for rid in ids}


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_the_request_that_breaks_the_runner_fails_alone(params, capsys):
    alone = make_engine()
    ids = [alone.add_request(words(40, s), params, request_id=f"r{s}") for s in (1, 2)]
    want = {rid: c.token_ids for rid, c in finish(alone, ids).items()}

    engine = make_engine()
    breaking(engine, "bad")
    ids = [engine.add_request(words(40, s), params, request_id=f"r{s}") for s in (1, 2)]
    engine.add_request(words(30, 9), params, request_id="bad")
    got = finish(engine, [*ids, "bad"])
    assert {rid: got[rid].token_ids for rid in ids} == want
    assert "internal error in the model runner: IndexError" in got["bad"].error
    assert "IndexError" in capsys.readouterr().err  # the traceback is printed, not swallowed
    drain_and_flush(engine)


def test_a_lone_request_that_breaks_the_runner_fails_and_the_engine_goes_on():
    engine = make_engine()
    breaking(engine, "bad")
    engine.add_request(words(30, 9), GREEDY, request_id="bad")
    engine.step()
    assert engine.request_info("bad").status is Status.FAILED
    ok = engine.add_request(words(30, 3), GREEDY)
    assert len(finish(engine, ["bad", ok])[ok].token_ids) == GREEDY.max_tokens
    drain_and_flush(engine)
