"""Streaming sessions (seed 001): one cache slot per conversation, across turns."""

from __future__ import annotations

import pytest
from conversations import oracle, small_cache
from sessionsim import SessionDriver, abort_mid_verify

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig, SpecConfig
from kvwatch.engine.cache.holder import HolderStatus
from kvwatch.engine.cache.protocol import holder_of
from kvwatch.engine.errors import ErrorKind, SessionError
from kvwatch.engine.events import RequestRetracted
from kvwatch.engine.request import Status

PARAMS = SamplingParams(max_tokens=10)


def engine(*, spec: bool = True, pressure: bool = False, max_running: int = 8) -> Engine:
    cache = small_cache(full=72, swa=64, state=24) if pressure else small_cache(full=1024)
    sched = SchedulerConfig(
        max_running=max_running, chunk_size=16, spec=SpecConfig(num_drafts=4) if spec else None
    )
    return Engine(EngineConfig(cache=cache, scheduler=sched))


def test_session_turns_equal_a_cache_off_replay_of_the_full_history():
    """Speculation, retractions under pressure and forced retractions all happen."""
    eng = engine(pressure=True)
    retracted = []
    eng.events.subscribe(RequestRetracted, retracted.append)

    def push_out(e: Engine) -> None:
        running = e.request_ids(Status.RUNNING)
        if len(running) > 1 and e.step_count % 4 == 0:
            e.retract(running[-1])

    driver = SessionDriver(eng, 4, seed=1)
    for _ in range(5):
        for _sid, prompt, output in driver.turn(PARAMS, after_step=push_out):
            assert output == oracle(prompt, PARAMS)
        assert eng.probe().clean
    assert retracted, "the run should push session turns out"


def test_eight_sessions_fifty_turns_keep_the_probe_clean_and_usage_bounded():
    eng = engine()
    driver = SessionDriver(eng, 8, seed=2, system_len=30)
    session_pages = []
    for _ in range(50):
        driver.turn(SamplingParams(max_tokens=6), user_len=(3, 10))
        report = eng.probe()
        assert report.clean, report.findings
        assert report.live_sessions == 8
        assert not any(b.exceeded for b in report.bounds.values()), report.bounds
        session_pages.append(report.groups["full.kv"].by_owner["session"])
    # A session's pages grow with its own context, nothing more.
    contexts = sum(len(h) for h in driver.history.values())
    assert session_pages[-1] <= contexts // 16 + 2 * 8
    for sid in driver.ids:
        eng.close_session(sid)
    report = eng.probe()
    assert report.groups["full.kv"].by_owner["session"] == 0 and report.live_sessions == 0
    eng.flush_cache()
    assert all(g.free == g.capacity for g in eng.probe().groups.values())


def test_a_session_that_starts_on_a_cached_prefix_stays_within_its_state_bound():
    """Its path snapshot is pinned by it alone, and while a turn runs it keeps the
    previous turn's end and the one before (a cut turn rolls back to it) beside
    the new frontier: four snapshots and the working state, every step."""
    eng = engine(spec=False)
    base = [(37 * i) % 190 + 10 for i in range(240)]
    eng.generate([base], PARAMS)  # the prefix, with its snapshots, in the tree
    sid = eng.open_session()
    tokens, seen = base + [11] * 30, 0
    for turn in range(4):
        rid = eng.add_request(tokens, PARAMS, session_id=sid)
        done = False
        while not done:
            for out in eng.step():
                if out.request_id == rid:
                    tokens, done = tokens + list(out.new_token_ids), out.finished
            report = eng.probe()
            assert not any(b.exceeded for b in report.bounds.values()), (turn, report.bounds)
            seen = max(seen, report.bounds["linear.state"].pinned)
        tokens = tokens + [12 + turn] * 40
    assert seen == 5  # the case the bound is for: path, two turn ends, frontier, working


def test_resume_frees_the_speculative_tail_page_aligned():
    eng = engine()
    eng.on_batch_computed(abort_mid_verify(eng, after_tokens=2))
    driver = SessionDriver(eng, 1, seed=3)
    sid = driver.ids[0]
    driver.turn(SamplingParams(max_tokens=30))
    holder = eng._sessions.get(sid).holder
    assert holder.status is HolderStatus.PARKED
    gap = holder.allocated_len - holder.computed_len
    assert gap > 0, "an abort mid-verify leaves the drafts' slots allocated"
    free_before = eng._cache.pools["full.kv"].free_count
    resumed = eng._cache.resume(holder)  # what the next turn's admission does
    assert resumed == holder.computed_len == holder.allocated_len
    assert len(holder_of(holder).full_pages) == -(-resumed // 16)  # the partial page stays
    assert eng._cache.pools["full.kv"].free_count >= free_before
    eng._cache.park(holder)
    assert eng.probe().clean


def test_aborted_turns_leave_the_session_usable_and_equivalent():
    eng = engine()
    remove = eng.on_batch_computed(abort_mid_verify(eng, after_tokens=3))
    driver = SessionDriver(eng, 3, seed=4)
    for _ in range(3):
        driver.turn(SamplingParams(max_tokens=20))
    assert eng.probe().clean
    # With the hook gone, turns run out and still match a full replay.
    remove()
    for _sid, prompt, output in driver.turn(PARAMS):
        assert output == oracle(prompt, PARAMS)


def test_rollback_then_continue_matches_the_replay():
    eng = engine()
    driver = SessionDriver(eng, 1, seed=5)
    sid = driver.ids[0]
    driver.turn(PARAMS)
    before = list(eng.session_tokens(sid))
    driver.turn(PARAMS)
    eng.rollback_session(sid, 1)
    assert list(eng.session_tokens(sid)) == before
    driver.history[sid] = before
    for _, prompt, output in driver.turn(PARAMS):  # resumes below the computed frontier
        assert output == oracle(prompt, PARAMS)
    assert eng.probe().clean


def test_closing_inserts_the_session_into_the_tree():
    eng = engine()
    driver = SessionDriver(eng, 1, seed=6)
    sid = driver.ids[0]
    driver.turn(PARAMS)
    driver.turn(PARAMS)
    history = driver.history[sid]
    eng.close_session(sid)
    follow = eng.generate([[*history, 33, 34]], PARAMS)[0]
    assert follow.cached_tokens >= len(history) - 16
    assert follow.token_ids == oracle([*history, 33, 34], PARAMS)


def test_session_errors_are_clean_and_change_nothing():
    eng = engine()
    sid = eng.open_session(record=True)
    with pytest.raises(SessionError) as unknown:
        eng.add_request([1, 2, 3], session_id="nope")
    assert unknown.value.kind is ErrorKind.NOT_FOUND
    first = eng.add_request([1, 2, 3], PARAMS, session_id=sid)
    with pytest.raises(SessionError) as busy:
        eng.add_request([1, 2, 3, 4], session_id=sid)
    assert busy.value.kind is ErrorKind.CONFLICT
    with pytest.raises(SessionError, match="turn in flight"):
        eng.close_session(sid)
    while eng.has_unfinished():
        eng.step()
    eng.take(first)
    tokens = list(eng.session_tokens(sid))
    for bad in ([9, 9, 9], tokens, tokens[:-1]):  # diverges, adds nothing, shrinks
        with pytest.raises(SessionError, match="must extend") as not_append:
            eng.add_request(bad, session_id=sid)
        assert not_append.value.kind is ErrorKind.INVALID
    with pytest.raises(SessionError, match="rolls back 1 to 1 assistant steps, not 2"):
        eng.rollback_session(sid, 2)
    assert list(eng.session_tokens(sid)) == tokens and eng.session_info(sid).turns == 1
    assert len(eng.trajectory(sid).token_ids) == len(tokens)
    eng.close_session(sid)
    with pytest.raises(SessionError) as closed:
        eng.close_session(sid)
    assert closed.value.kind is ErrorKind.CONFLICT and closed.value.code == "session_closed"
    with pytest.raises(SessionError) as missing:
        eng.close_session("never-opened")
    assert missing.value.code == "session_not_found"
    assert eng.probe().clean


def test_rollback_then_close_inserts_only_the_kept_tokens():
    eng = engine()
    driver = SessionDriver(eng, 1, seed=13)
    sid = driver.ids[0]
    driver.turn(PARAMS)
    kept = list(eng.session_tokens(sid))
    driver.turn(PARAMS)
    eng.rollback_session(sid, 1)
    holder = eng._sessions.get(sid).holder
    assert holder.computed_len <= len(kept)  # the slot's state no longer outruns its tokens
    eng.close_session(sid)
    report = eng.probe()
    assert report.clean, report.findings
    follow = eng.generate([[*kept, 35]], PARAMS)[0]
    assert follow.token_ids == oracle([*kept, 35], PARAMS)
