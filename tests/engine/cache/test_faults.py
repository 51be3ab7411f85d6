"""Each cache fault is flagged by the audit or the bounded-usage check, and the
same scenario is clean without it. Seed 000's first fault has its own module."""

from __future__ import annotations

import itertools
import random

import pytest
from cachesim import INT_LAYOUTS, SimRunner, cache_config, run_turn

from kvwatch.contracts import FindingKind
from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.base import CacheBase
from kvwatch.engine.cache.protocol import holder_of
from kvwatch.engine.cache.usage import usage_bounds
from kvwatch.engine.config import (
    FULL_KV,
    LINEAR_STATE,
    STATE_GROUPS,
)
from kvwatch.engine.faults import Fault

CONFIG = cache_config(window=16, interval=64, page=8, full=1024, swa=128, snapshots=128, host=32)
NONE = frozenset()


def words(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(40) for _ in range(n)]


def kinds(cache: CacheBase) -> list[str]:
    return [f.kind for f in audit(cache.view).findings]


# -- seed 000, first review comment ---------------------------------------------------
def retracted_sharer(faults: frozenset[Fault]):
    """A retracted request recovers from a prefix node another request keeps using.

    A and B share a prompt whose end N carries a snapshot. A is retracted right
    there, so it keeps a host ref on N. B then runs on alone: at each commit N
    is an interior node with a single device holder (B).
    """
    rng = random.Random(1)
    cache = build_cache(CONFIG, INT_LAYOUTS, faults=faults)
    sim = SimRunner(cache)
    prompt = words(rng, 40)
    seeder = cache.open([*prompt, 0])
    cache.match(seeder)
    run_turn(sim, seeder, [], chunk=16, decode=[])
    cache.release(seeder, commit=True)
    a, b = cache.open([*prompt, 1]), cache.open([*prompt, 2])
    assert cache.match(a).resume_len == cache.match(b).resume_len == 40
    cache.retract(a)
    for _ in range(3):
        run_turn(sim, b, words(rng, 30), chunk=16, decode=words(rng, 4))
    return cache, a


def test_snapshot_release_keeps_host_referenced_recovery_state():
    cache, a = retracted_sharer(NONE)
    assert kinds(cache) == []
    assert cache.match(a).resume_len == 40  # recovers exactly where it stopped


def test_snapshot_release_ignoring_host_refs_is_flagged():
    cache, a = retracted_sharer(frozenset({Fault.SNAPSHOT_RELEASE_IGNORES_HOST_REFS}))
    report = audit(cache.view)
    assert [f.kind for f in report.findings] == [FindingKind.TREE]
    assert "retracted holder(s) recover from it, but its state is gone" in report.findings[0].detail
    assert cache.match(a).resume_len == 0  # the recovery state is gone: recompute all


# -- seed 000, second review comment --------------------------------------------------
def branch_past_history_only_node(faults: frozenset[Fault]):
    """A later request branches below a node whose snapshot was released.

    A runs two turns, so its first terminal N1 becomes a superseded interior
    node and loses its state. B shares A's tokens through N1 and into A's
    second turn, then branches before A's next complete snapshot, and keeps
    running turns on its own path.
    """
    rng = random.Random(2)
    cache = build_cache(CONFIG, INT_LAYOUTS, faults=faults)
    sim = SimRunner(cache)
    a = cache.open(words(rng, 44))
    cache.match(a)
    run_turn(sim, a, [], chunk=16, decode=words(rng, 4))
    n1 = holder_of(a).lock_node
    run_turn(sim, a, words(rng, 40), chunk=16, decode=words(rng, 4))
    assert n1.snapshot is not None and n1.snapshot.history_only

    b = cache.open(holder_of(a).tokens[: n1.depth + 16] + [99] * 5)
    cache.match(b)
    pinned = []
    for _ in range(6):
        run_turn(sim, b, words(rng, 70), chunk=16, decode=words(rng, 4))
        pinned.append(usage_bounds(cache.view)[LINEAR_STATE].pinned)
    return cache, b, pinned


def test_history_only_node_is_skipped_and_commit_goes_on():
    cache, b, pinned = branch_past_history_only_node(NONE)
    assert b.cached_len == len(holder_of(b).tokens) - len(holder_of(b).tokens) % CONFIG.page_size
    assert not holder_of(b).pending
    assert not any(bound.exceeded for bound in usage_bounds(cache.view).values())
    assert len(set(pinned)) == 1, pinned  # flat across turns
    assert kinds(cache) == []


def test_history_only_anchor_fault_is_flagged_by_the_usage_bound():
    cache, b, pinned = branch_past_history_only_node(frozenset({Fault.HISTORY_ONLY_ANCHOR}))
    bounds = usage_bounds(cache.view)
    assert any(bounds[g].exceeded for g in STATE_GROUPS), bounds
    assert all(y > x for x, y in itertools.pairwise(pinned)), pinned  # grows every turn
    # The commit is stuck in front of the history-only node, so nothing B ran
    # after it reached the tree, and B keeps every snapshot it took.
    assert b.cached_len < 100
    assert len(holder_of(b).pending) >= 6
    assert kinds(cache) == []  # nothing is orphaned: B still owns what it keeps


# -- seed 002 ---------------------------------------------------------------------------
def misses(faults: frozenset[Fault], trim_to_empty: bool):
    """A request misses the tree, or its match trims back to nothing."""
    rng = random.Random(3)
    cache = build_cache(CONFIG, INT_LAYOUTS, faults=faults)
    sim = SimRunner(cache)
    prompt = words(rng, 40)
    if trim_to_empty:  # history is cached but no node on the path has a snapshot
        seeder = cache.open([*prompt, 0])
        cache.match(seeder)
        sim.compute(seeder, 40)
        cache.commit_chunk(seeder)
        cache.release(seeder, commit=False)
        assert cache.view.tree.node_count and not cache.view.tree.snapshot_nodes
    holder = cache.open([*prompt, 5] if trim_to_empty else words(rng, 20))
    match = cache.match(holder)
    assert match.resume_len == 0 and (match.hit_len > 0) == trim_to_empty
    return cache, 2 if trim_to_empty else 1  # the seeder's first match missed too


@pytest.mark.parametrize("trim_to_empty", [False, True], ids=["miss", "trim-to-empty"])
def test_root_refs_stay_exact_on_a_miss(trim_to_empty):
    cache, _ = misses(NONE, trim_to_empty)
    report = audit(cache.view)
    assert report.clean and report.root_refs.actual == report.root_refs.expected == 0


@pytest.mark.parametrize("trim_to_empty", [False, True], ids=["miss", "trim-to-empty"])
def test_root_ref_leak_on_miss_is_flagged(trim_to_empty):
    cache, n_misses = misses(frozenset({Fault.ROOT_REF_LEAK_ON_MISS}), trim_to_empty)
    report = audit(cache.view)
    assert report.root_refs.actual == report.root_refs.expected + n_misses  # one per miss
    assert [f.kind for f in report.findings] == [FindingKind.REF_MISMATCH]
    assert report.findings[0].detail.startswith("root:")


def emptied_tree(faults: frozenset[Fault]) -> CacheBase:
    """Cache a conversation, finish it, then flush: the tree is just the root again."""
    cache = build_cache(CONFIG, INT_LAYOUTS, faults=faults)
    sim = SimRunner(cache)
    holder = cache.open(words(random.Random(4), 50))
    cache.match(holder)
    run_turn(sim, holder, [], chunk=16, decode=[])
    cache.release(holder, commit=True)
    cache.flush()
    assert cache.view.tree.node_count == 0
    return cache


def test_root_stays_out_of_the_evict_set():
    cache = emptied_tree(NONE)
    assert cache.view.tree.root not in cache.view.tree.evictable
    assert cache._store.evict(FULL_KV, 4) == 0  # nothing to evict, and no error
    assert kinds(cache) == []


def test_root_in_evict_set_is_flagged():
    cache = emptied_tree(frozenset({Fault.ROOT_IN_EVICT_SET}))
    report = audit(cache.view)
    assert [f.kind for f in report.findings] == [FindingKind.TREE]
    assert "root is in the evict set" in report.findings[0].detail
    assert cache._store.evict(FULL_KV, 4) == 0  # latent, as in the report: nothing is ever taken
