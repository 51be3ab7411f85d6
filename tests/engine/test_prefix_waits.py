"""Shared-prefix waits: a queued request that shares a prefix with one still
computing it waits, then resumes where it branches off, computing only its own
tokens; outputs stay those of a dense run; nothing is kept once no one waits.

Two prompts over one 100-token prefix, pages of 16 (so the branch point is 96)::

    q   [ common (100) ][ q's own (80) ]
    r   [ common (100) ][ r's own (30) ]      r resumes at 96 and computes 34
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from conversations import small_cache
from hypothesis import given
from hypothesis import strategies as st
from modelref import dense_greedy

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig
from kvwatch.engine.events import PrefillChunk, RequestScheduled
from kvwatch.engine.prefix_wait import shared_len
from kvwatch.engine.request import Status

PARAMS = SamplingParams(max_tokens=4)
BRANCH = 96  # the common prefix (100 tokens) rounded down to a 16-token page


def words(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(32, 127) for _ in range(n)]


COMMON = words(100, seed=0)
Q, R = COMMON + words(80, seed=1), COMMON + words(30, seed=2)


def engine_with(*, waits: bool, max_running: int = 8) -> tuple[Engine, dict, dict]:
    """An engine and, per request id, its prefill tokens computed and cached tokens."""
    engine = Engine(
        EngineConfig(
            cache=small_cache(),
            scheduler=SchedulerConfig(
                max_running=max_running, chunk_size=16, max_batch_tokens=64, prefix_waits=waits
            ),
        )
    )
    computed: dict[str, int] = defaultdict(int)
    cached: dict[str, int] = {}
    engine.events.subscribe(
        PrefillChunk,
        lambda e: computed.__setitem__(e.request_id, computed[e.request_id] + e.tokens),
    )
    engine.events.subscribe(
        RequestScheduled, lambda e: cached.__setitem__(e.request_id, e.cached_tokens)
    )
    return engine, computed, cached


def run(engine: Engine, *ids: str) -> dict:
    while engine.has_unfinished():
        engine.step()
    return {rid: engine.take(rid) for rid in ids}


def assert_nothing_kept(engine: Engine) -> None:
    report = engine.probe()
    assert report.clean, report.findings
    assert not engine._cache.view.stored.kept_for_waiters()
    assert not any(report.tree.interior_snapshots.values())


@given(
    st.lists(st.integers(0, 3), max_size=40),
    st.lists(st.integers(0, 3), max_size=40),
    st.integers(0, 50),
)
def test_shared_len_is_the_common_prefix_length(a, b, limit):
    naive = 0
    while naive < min(limit, len(a), len(b)) and a[naive] == b[naive]:
        naive += 1
    assert shared_len(a, b, limit) == naive


@pytest.mark.parametrize("waits", [True, False])
def test_a_request_sharing_a_prefix_being_computed_waits_and_resumes_at_the_branch(waits):
    engine, computed, cached = engine_with(waits=waits)
    q = engine.add_request(Q, PARAMS)
    r = engine.add_request(R, PARAMS)
    out = run(engine, q, r)
    assert computed[q] == len(Q)
    if waits:
        assert (cached[r], computed[r]) == (BRANCH, len(R) - BRANCH)
    else:  # admitted beside q: the prefix is computed twice
        assert (cached[r], computed[r]) == (0, len(R))
    for rid, prompt in ((q, Q), (r, R)):
        assert out[rid].token_ids == dense_greedy(engine.model, prompt, PARAMS.max_tokens)
    assert_nothing_kept(engine)


def test_a_waiter_still_queued_after_its_sharer_finished_resumes_at_the_branch():
    """One request at a time: r cannot be admitted while q runs, so q finishes
    (and leaves) first. The state q captured at the branch must outlive q until
    r is admitted."""
    engine, computed, cached = engine_with(waits=True, max_running=1)
    q = engine.add_request(Q, PARAMS)
    r = engine.add_request(R, PARAMS)
    out = run(engine, q, r)
    assert (cached[r], computed[r]) == (BRANCH, len(R) - BRANCH)
    assert out[r].token_ids == dense_greedy(engine.model, R, PARAMS.max_tokens)
    assert_nothing_kept(engine)


def test_a_waiter_aborted_in_the_queue_leaves_nothing_kept():
    engine, computed, _ = engine_with(waits=True, max_running=1)
    q = engine.add_request(Q, PARAMS)
    r = engine.add_request(R, PARAMS)
    engine.step()
    assert engine.request_info(r).status is Status.WAITING and r not in computed
    while engine._requests[q].holder.computed_len < 176:  # past 128, an interval snapshot
        engine.step()
        # what is kept for the queued request is no live holder's own: within every bound
        bounds = engine.probe().bounds
        assert not [b for b in bounds.values() if b.exceeded], bounds
    assert [n.depth for n in engine._cache.view.stored.kept_for_waiters()] == [BRANCH]
    (kept,) = engine._cache.view.stored.kept_for_waiters()
    engine.abort(r)  # the queue is empty now: no one will branch off at 96
    assert not engine._cache.view.stored.kept_for_waiters() and not kept.has_complete_snapshot
    run(engine, q, r)
    assert_nothing_kept(engine)
    assert r not in computed
