"""A failure on one request's code path fails that request alone.

Each test makes a real function on one request's path raise (the sampler,
the page allocation, the commit of its step) while others share its batch.
The loop goes on, the others produce exactly what a clean run produces, and
the probe is clean once everything drained. Also: under pool pressure,
retracted requests give up their recovery points before anyone fails; and a
listener that raises on every event changes nothing the engine does.
"""

from __future__ import annotations

import pytest
from conversations import small_cache

from kvwatch.contracts import FindingKind
from kvwatch.engine import Engine, EngineConfig, SamplingParams, events
from kvwatch.engine.events import RequestRetracted

SAMPLED = [SamplingParams(max_tokens=16, temperature=0.8, seed=s, ignore_eos=True) for s in (1, 2)]
POISON = SamplingParams(max_tokens=16, temperature=0.8, seed=666, ignore_eos=True)
PROMPTS = ["the first prompt", "a second, longer prompt than that"]


def clean_outputs() -> list[list[int]]:
    engine = Engine(EngineConfig(cache=small_cache()))
    return [engine.generate([p], s)[0].token_ids for p, s in zip(PROMPTS, SAMPLED, strict=True)]


def run_with_poison(engine: Engine) -> tuple[list, object]:
    """The poisoned request sits between the two others, so it fails mid-batch."""
    first = engine.add_request(PROMPTS[0], SAMPLED[0])
    poisoned = engine.add_request("poison", POISON)
    second = engine.add_request(PROMPTS[1], SAMPLED[1])
    while engine.has_unfinished():
        engine.step()
    return [engine.take(first), engine.take(second)], engine.take(poisoned)


def is_poisoned(engine: Engine, holder) -> bool:
    return any(r.holder is holder and r.params.seed == 666 for r in engine._requests.values())


def assert_drained_and_clean(engine: Engine) -> None:
    report = engine.probe()
    assert report.clean, report.findings
    assert report.live_requests == 0 and not engine.request_ids()
    assert all(g.by_owner["request"] == 0 for g in report.groups.values())


def test_a_sampler_failure_fails_one_request_and_the_batch_gets_its_exact_results(
    monkeypatch, capsys
):
    """The sampler raises for one request after the request before it in the batch has
    sampled: the batch is re-run piece by piece from the generators' saved states."""
    engine = Engine(EngineConfig(cache=small_cache()))
    sample = engine._runner._sample

    def sampler(req, logits):
        if req.params.seed == 666 and len(req.output_ids) >= 4:
            raise RuntimeError("sampler failure")
        return sample(req, logits)

    monkeypatch.setattr(engine._runner, "_sample", sampler)
    done, poisoned = run_with_poison(engine)
    assert poisoned.finish_reason == "error" and "sampler failure" in poisoned.error
    assert len(poisoned.token_ids) == 4
    assert [c.token_ids for c in done] == clean_outputs()
    assert all(c.finish_reason == "length" for c in done)
    assert_drained_and_clean(engine)
    assert "sampler failure" in capsys.readouterr().err  # the traceback is logged


@pytest.mark.parametrize("where", ["allocate", "commit_chunk"])
def test_a_cache_failure_on_one_requests_path_fails_it_alone(monkeypatch, where):
    """Allocation for its next piece, or the commit of its step, raises for one request."""
    engine = Engine(EngineConfig(cache=small_cache()))
    real = getattr(engine._cache, where)
    calls = {"n": 0}

    def broken(holder, *args, **kwargs):
        if is_poisoned(engine, holder):
            calls["n"] += 1
            if calls["n"] >= 3:
                raise RuntimeError(f"{where} failure")
        return real(holder, *args, **kwargs)

    monkeypatch.setattr(engine._cache, where, broken)
    done, poisoned = run_with_poison(engine)
    assert poisoned.finish_reason == "error"
    assert poisoned.error.startswith("internal error") and f"{where} failure" in poisoned.error
    assert [c.token_ids for c in done] == clean_outputs()
    assert_drained_and_clean(engine)


def test_retracted_requests_give_up_their_recovery_points_before_a_request_fails():
    """Four requests of 14 pages on a 24-page pool: retracted ones pin their paths, and
    without letting go of them all but one would fail for want of pages."""
    prompts = [str(i) * 150 for i in range(4)]
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    want = Engine(EngineConfig(cache=small_cache(full=512))).generate(prompts, params)
    engine = Engine(EngineConfig(cache=small_cache(full=24)))
    retracted: list[RequestRetracted] = []
    engine.events.subscribe(RequestRetracted, retracted.append)
    got = engine.generate(prompts, params)
    assert [c.error for c in got] == [None] * 4
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert len(retracted) >= 3
    assert_drained_and_clean(engine)


def test_a_raising_listener_changes_nothing_the_engine_does():
    """A handler on every event type raises each time: the outputs are the clean
    run's token for token, the audit is clean, and every failure is counted and
    shows in the probe as one ``listener`` finding."""
    engine = Engine(EngineConfig(cache=small_cache()))
    delivered: list[str] = []

    def broken(event) -> None:
        delivered.append(type(event).__name__)
        raise RuntimeError("listener bug")

    kinds = [v for v in vars(events).values() if isinstance(v, type) and hasattr(v, "_fields")]
    for kind in kinds:
        engine.events.subscribe(kind, broken)
    got = [engine.generate([p], s)[0].token_ids for p, s in zip(PROMPTS, SAMPLED, strict=True)]
    assert got == clean_outputs()
    assert delivered and engine.events.failure_count == len(delivered)
    assert engine.events.failures["RequestFinished"] == 2
    report = engine.probe()
    assert [f.kind for f in report.findings] == [FindingKind.LISTENER]
    assert f"raised {len(delivered)} times" in report.findings[0].detail
    assert "RequestFinished 2" in report.findings[0].detail
    assert report.live_requests == 0 and not engine.request_ids()
    assert all(g.by_owner["request"] == 0 for g in report.groups.values())


def run_turn(engine: Engine, tokens: list[int], params, session_id: str | None = None):
    rid = engine.add_request(tokens, params, session_id=session_id)
    while not engine.request_info(rid).done:
        engine.step()
    return engine.take(rid)


def test_parked_session_slots_give_their_pages_up_before_a_request_fails():
    """Two idle sessions park 10-page slots on a 24-page pool: a 10-page request fits
    only if one lets go, and that session recomputes its next turn from the tree."""
    params = SamplingParams(max_tokens=8, ignore_eos=True)

    def conversation(engine: Engine) -> list:
        sids = [engine.open_session() for _ in range(2)]
        tokens = {sid: engine.tokenizer.encode(c * 150) for sid, c in zip(sids, "ac", strict=True)}
        outputs = []
        for sid in sids:
            outputs.append(run_turn(engine, tokens[sid], params, sid))
            tokens[sid] += outputs[-1].token_ids
        parked = engine.probe().groups["full.kv"].by_owner["session"]
        outputs.append(run_turn(engine, engine.tokenizer.encode("e" * 150), params))
        for sid, c in zip(sids, "bd", strict=True):
            tokens[sid] += engine.tokenizer.encode(c * 20)
            outputs.append(run_turn(engine, tokens[sid], params, sid))
            engine.close_session(sid)
        return [parked, *outputs]

    want = conversation(Engine(EngineConfig(cache=small_cache(full=512))))
    engine = Engine(EngineConfig(cache=small_cache(full=24)))
    got = conversation(engine)
    assert got[0] >= 20  # the parked slots hold most of the pool
    assert [c.error for c in got[1:]] == [None] * 5
    assert [c.token_ids for c in got[1:]] == [c.token_ids for c in want[1:]]
    assert_drained_and_clean(engine)
