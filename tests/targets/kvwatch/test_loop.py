"""``KvwatchLoop``: kvwatch's engine as an ``EngineLoop`` (the history tier's driver)."""

from __future__ import annotations

import pytest

from kvwatch.targets.driver.engine_loop import ABORTED, FINISHED, Refused
from kvwatch.targets.kvwatch.histories import KvwatchHistoryTarget


def _run(loop, limit=500):
    for _ in range(limit):
        if loop.idle():
            return
        loop.step()
    raise AssertionError("not idle")


def test_requests_end_with_their_inputs_outputs_and_hits():
    loop = KvwatchHistoryTarget().make_loop()
    prompt = list(range(40, 80))
    loop.submit("a", prompt, 4)
    assert loop.stage("a") == "queued"
    _run(loop)
    loop.submit("b", [*prompt, 90], 4)
    _run(loop)
    ends = {o.rid: o.status for o in loop.outcomes}
    assert ends == {"a": FINISHED, "b": FINISHED}
    assert loop.input_of("b") == (*prompt, 90) and len(loop.output_of("b")) == 4
    assert loop.hit_of("a") == 0 and loop.hit_of("b") == 32  # two whole pages of a's
    assert loop.stage("a") is None and loop.flush()


def test_a_session_turn_is_built_on_the_session_and_a_busy_session_refuses():
    loop = KvwatchHistoryTarget().make_loop()
    loop.open_session("s")
    loop.submit("t0", [50, 51, 52], 3, session_id="s")
    with pytest.raises(Refused, match="in flight"):
        loop.submit("t1", [53], 3, session_id="s")
    with pytest.raises(Refused):
        loop.close_session("s")
    assert not loop.flush()  # refused while a request runs
    _run(loop)
    loop.submit("t1", [53], 3, session_id="s")
    assert loop.input_of("t1") == (50, 51, 52, *loop.output_of("t0"), 53)
    loop.abort("t1")
    assert loop.outcomes[-1].status == ABORTED and not loop.admitted("t1")
    with pytest.raises(Refused, match="does not exist"):
        loop.submit("x", [1], 1, session_id="nope")
