"""Lifecycle coverage: the counter follows an engine's events through each machine."""

from __future__ import annotations

from kvwatch.engine import Engine, EngineConfig, SamplingParams
from kvwatch.engine.overrides import apply_overrides
from kvwatch.instrumentation.coverage import MACHINES, coverage, merge, since
from kvwatch.instrumentation.lifecycle import LifecycleCounter


def _run(engine: Engine, rid: str) -> None:
    while not engine.request_info(rid).done:
        engine.step()


def test_a_request_and_a_session_walk_their_machines():
    engine = Engine()
    counter = LifecycleCounter(engine.events)
    sid = engine.open_session()
    rid = engine.add_request("hello there", SamplingParams(max_tokens=3), session_id=sid)
    _run(engine, rid)
    engine.take(rid)
    tokens = [*engine.session_tokens(sid), 65, 66, 67]
    rid = engine.add_request(tokens, SamplingParams(max_tokens=3), session_id=sid)
    _run(engine, rid)
    engine.take(rid)
    engine.rollback_session(sid)
    engine.close_session(sid)
    queued = engine.add_request("never runs", SamplingParams(max_tokens=3))
    engine.abort(queued)
    taken = counter.taken()
    assert taken["request"] == {
        "new -> queued": 3,
        "queued -> prefilling": 2,
        "prefilling -> decoding": 2,
        "decoding -> finished": 2,
        "queued -> aborted": 1,
    }
    assert taken["session"] == {
        "new -> open": 1,
        "open -> running": 1,
        "running -> parked": 2,
        "parked -> running": 1,
        "parked -> rolled back": 1,
        "rolled back -> closed": 1,
    }
    # nothing is kept for requests and sessions that ended
    assert counter.requests == {} and counter.sessions == {} and counter.turns == {}


def test_retraction_recovery_and_an_abort_while_retracted():
    engine = Engine()
    counter = LifecycleCounter(engine.events)
    rid = engine.add_request("a longer prompt " * 8, SamplingParams(max_tokens=4))
    engine.step()
    engine.retract(rid, hold_steps=0)
    _run(engine, rid)
    engine.take(rid)
    other = engine.add_request("another prompt " * 8, SamplingParams(max_tokens=4))
    engine.step()
    engine.retract(other, hold_steps=100)
    engine.abort(other)
    taken = counter.taken()["request"]
    assert taken["prefilling -> retracted"] == 2
    assert taken["retracted -> recovering"] == 1
    assert taken["retracted -> aborted"] == 1
    assert taken.get("recovering -> decoding", 0) + taken.get("recovering -> verifying", 0) == 1


def test_a_pause_then_a_resume_and_a_pause_then_an_abort():
    engine = Engine()
    counter = LifecycleCounter(engine.events)
    rids = [engine.add_request(f"prompt {i} " * 8, SamplingParams(max_tokens=6)) for i in (0, 1)]
    while any(engine.request_info(r).output_tokens < 2 for r in rids):
        engine.step()
    for rid in rids:
        engine.pause(rid)
    engine.resume(rids[0])
    _run(engine, rids[0])
    engine.abort(rids[1])
    taken = counter.taken()["request"]
    assert taken["decoding -> paused"] == 2
    assert taken["paused -> recovering"] == 1 and taken["paused -> aborted"] == 1
    assert taken["decoding -> finished"] == 1
    assert coverage(counter.taken())["request"]["unlisted"] == {}
    assert counter.requests == {}


def test_a_slot_is_prepared_filled_restored_and_flushed():
    config = apply_overrides(EngineConfig(), {"cache": {"mode": "slots", "slots": 2}})
    engine = Engine(config)
    counter = LifecycleCounter(engine.events)
    history = [
        {"role": "system", "content": "a conversation that keeps going " * 4},
        {"role": "user", "content": "the first question, asked at some length " * 3},
    ]
    first = engine.generate([engine.chat_template.render(history)], SamplingParams(max_tokens=4))
    follow_up = engine.chat_template.continue_session(
        [*first[0].prompt_token_ids, *first[0].token_ids],
        [{"role": "user", "content": "and a follow-up"}],
    )
    engine.generate([follow_up], SamplingParams(max_tokens=4))
    engine.flush_cache()
    taken = counter.taken()["slot"]
    assert taken["empty -> prepared"] >= 1 and taken["prepared -> filled"] >= 1
    assert taken["filled -> restored"] == 1
    assert taken["filled -> evicted (flush)"] >= 1


def test_coverage_lists_never_taken_and_unlisted_transitions():
    taken = {"request": {"new -> queued": 4, "queued -> nowhere": 1}, "slot": {}}
    report = coverage(taken)
    assert report["request"]["taken"] == {"new -> queued": 4}
    assert "queued -> prefilling" in report["request"]["never"]
    assert report["request"]["unlisted"] == {"queued -> nowhere": 1}
    assert report["session"]["total"] == len(MACHINES["session"].transitions)
    assert merge(taken, {"request": {"new -> queued": 1}})["request"]["new -> queued"] == 5
    before = {"request": {"new -> queued": 4}}
    assert since(before, {"request": {"new -> queued": 6, "queued -> prefilling": 1}}) == {
        "request": {"new -> queued": 2, "queued -> prefilling": 1}
    }
