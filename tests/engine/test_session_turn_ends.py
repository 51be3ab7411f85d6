"""A session's turn-end snapshots are its recorded turn ends, never a frontier a park left.

A slot is parked at a turn's end, and also in the middle of one (a
retraction, a pause, an abort). Only the turn ends the session records may
count against the MAX_ROLLBACK + 1 turn-end snapshots a slot keeps: if a
mid-turn frontier counted, it would push out the previous real turn end, and
a rollback of that turn would find nothing to rewind to, drop the slot and
recompute the whole conversation.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from conversations import oracle, small_cache
from sessionsim import system_prompt, user_turn

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig
from kvwatch.engine.cache.holder import PendingKind
from kvwatch.engine.cache.protocol import holder_of
from kvwatch.engine.events import RequestPaused, RequestRetracted
from kvwatch.engine.request import Status

PARAMS = SamplingParams(max_tokens=12)
LONG = SamplingParams(max_tokens=48)  # the disturbed turn: its frontier moves on after it
Disturb = Callable[[Engine, str], bool]  # True once it has acted on the turn


def engine() -> Engine:
    sched = SchedulerConfig(chunk_size=16)
    return Engine(EngineConfig(cache=small_cache(full=1024), scheduler=sched))


def mid_prefill(eng: Engine, rid: str) -> bool:
    """Two chunks into the turn's new prompt tokens (of about 60)."""
    beyond = eng.computed_beyond_cache(rid)
    return beyond is not None and beyond >= 32


def mid_decode(eng: Engine, rid: str) -> bool:
    """Four tokens into the output: dozens more follow, across page boundaries."""
    return eng.request_info(rid).output_tokens >= 4


def retract(eng: Engine, rid: str) -> None:
    eng.retract(rid, hold_steps=2)


def pause(eng: Engine, rid: str) -> None:
    eng.pause(rid)
    eng.resume(rid)


def abort(eng: Engine, rid: str) -> None:
    eng.abort(rid)


def at(when: Callable[[Engine, str], bool], action: Callable[[Engine, str], None]) -> Disturb:
    def disturb(eng: Engine, rid: str) -> bool:
        if when(eng, rid):
            action(eng, rid)
            return True
        return False

    return disturb


def run_turn(
    eng: Engine,
    sid: str,
    prompt: list[int],
    disturb: Disturb | None = None,
    params: SamplingParams = PARAMS,
):
    """One session turn to its end; ``disturb`` runs between steps until it acts."""
    rid = eng.add_request(prompt, params, session_id=sid)
    while eng.has_unfinished():
        eng.step()
        if disturb is not None and eng.request_info(rid).status is Status.RUNNING:
            disturb = None if disturb(eng, rid) else disturb
    assert disturb is None, "the turn ended before it could be disturbed"
    done = eng.take(rid)
    assert done.error is None, done.error
    return done


def turn_ends(eng: Engine, sid: str) -> list[int]:
    slot = holder_of(eng._sessions.get(sid).holder)
    return sorted(b for b, p in slot.pending.items() if p.kind is PendingKind.TERMINAL)


def clean_and_bounded(eng: Engine) -> None:
    report = eng.probe()
    assert report.clean, report.findings
    assert not any(b.exceeded for b in report.bounds.values()), report.bounds


def rolled_back_retry(disturb: Disturb | None, eng: Engine | None = None, *, record: bool = False):
    """Turn 0, turn 1 (disturbed mid-turn), rollback of turn 1, the same turn 1
    again. Returns the retried turn's completion, its prompt, the slot's
    turn-end snapshots before the rollback, and the engine."""
    eng, rng = eng or engine(), random.Random(7)
    sid = eng.open_session(record=record)
    run_turn(eng, sid, system_prompt(rng, 200) + user_turn(rng, 40))
    prompt = [*eng.session_tokens(sid), *user_turn(rng, 60)]
    run_turn(eng, sid, prompt, disturb, LONG)
    clean_and_bounded(eng)
    ends = turn_ends(eng, sid)
    eng.rollback_session(sid, 1)
    retried = run_turn(eng, sid, prompt)
    assert retried.token_ids == oracle(prompt, PARAMS)
    clean_and_bounded(eng)
    return retried, prompt, ends, eng


@pytest.mark.parametrize("when", [mid_prefill, mid_decode])
@pytest.mark.parametrize("action, event", [(retract, RequestRetracted), (pause, RequestPaused)])
def test_a_rollback_after_a_disturbed_turn_resumes_from_the_previous_turn_end(when, action, event):
    """Before the fix the retried turn found 0 cached tokens: the park at the
    retraction or pause had made the mid-turn frontier a turn end, and the
    cap had pushed out the end of turn 0."""
    calm, prompt, calm_ends, _ = rolled_back_retry(None)
    assert calm.cached_tokens >= len(prompt) - 80  # resumes at the end of turn 0
    eng, seen = engine(), []
    eng.events.subscribe(event, seen.append)
    retried, _, ends, _ = rolled_back_retry(at(when, action), eng)
    assert len(seen) == 1  # the turn was disturbed, once
    cached, calm_cached = retried.cached_tokens, calm.cached_tokens
    assert cached == calm_cached, f"{cached} of {len(prompt)} cached, {calm_cached} undisturbed"
    assert ends == calm_ends  # the turn ends of turns 0 and 1, nothing mid-turn


def test_records_and_trajectory_follow_the_rollback_of_a_retracted_turn():
    retried, prompt, _, eng = rolled_back_retry(at(mid_decode, retract), record=True)
    sid = next(iter(eng.open_sessions()))
    traj = eng.trajectory(sid)
    assert traj.token_ids == [*prompt, *retried.token_ids]
    assert eng.session_info(sid).turns == 2


def test_an_aborted_turn_does_not_take_a_turn_end_from_the_rollback():
    """Turn 1 is cut mid-run (its prompt and output stay, unrecorded), turn 2
    goes on from it and finishes; rolling turn 2 back returns to the end of
    turn 0, which the slot still has."""
    eng, rng = engine(), random.Random(11)
    sid = eng.open_session()
    run_turn(eng, sid, system_prompt(rng, 200) + user_turn(rng, 40))
    kept = list(eng.session_tokens(sid))
    ends_after_0 = turn_ends(eng, sid)
    run_turn(eng, sid, [*kept, *user_turn(rng, 30)], at(mid_decode, abort), LONG)
    clean_and_bounded(eng)  # the cut turn's frontier stays a TRACK beside two turn ends
    run_turn(eng, sid, [*eng.session_tokens(sid), *user_turn(rng, 30)])
    assert turn_ends(eng, sid)[0] == ends_after_0[-1]
    eng.rollback_session(sid, 1)
    assert list(eng.session_tokens(sid)) == kept
    prompt = [*kept, *user_turn(rng, 20)]
    retried = run_turn(eng, sid, prompt)
    assert retried.cached_tokens >= len(kept) - 16
    assert retried.token_ids == oracle(prompt, PARAMS)
    clean_and_bounded(eng)
