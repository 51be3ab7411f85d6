"""Pool, tree and holder mechanics, one at a time."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from cachesim import INT_LAYOUTS, SimRunner, cache_config, run_turn

from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.holder import HolderStatus, PendingKind
from kvwatch.engine.cache.node import EMPTY_PAGES, Tier
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.pool import OwnershipError, PageLayout, PagePool, PoolExhausted
from kvwatch.engine.cache.protocol import Match, holder_of
from kvwatch.engine.cache.radix import RadixTree
from kvwatch.engine.cache.usage import group_usage
from kvwatch.engine.config import (
    FULL_KV,
    LINEAR_STATE,
    SWA_KV,
    SWA_WINDOW,
    CacheConfig,
    GroupSpec,
)
from kvwatch.engine.faults import Fault
from kvwatch.engine.probe import QueueReport, take_stats

REQ = Owner(OwnerKind.REQUEST, 1)
OTHER = Owner(OwnerKind.REQUEST, 2)


def small_config(**overrides: GroupSpec) -> CacheConfig:
    base = cache_config(window=8, interval=16, page=4, full=64, swa=32, snapshots=8, host=4)
    return replace(base, **overrides)


# -- PagePool ---------------------------------------------------------------------------
def test_pool_hands_out_pages_in_order_and_takes_them_back():
    pool = PagePool(FULL_KV, 4, 8, PageLayout((), torch.int64))
    first = pool.alloc(3, REQ)
    assert first.tolist() == [0, 1, 2] and pool.free_count == 5
    pool.free(first, REQ)
    assert pool.free_count == 8
    assert pool.alloc(3, OTHER).tolist() == [0, 1, 2]


def test_pool_refuses_double_free_and_foreign_free():
    pool = PagePool(FULL_KV, 4, 8, PageLayout())
    pages = pool.alloc(2, REQ)
    with pytest.raises(OwnershipError, match="request 2 tried to free"):
        pool.free(pages, OTHER)
    pool.free(pages, REQ)
    with pytest.raises(OwnershipError, match="held by \\['free'"):
        pool.free(pages, REQ)
    assert pool.free_count == 8


# page by page, as lists, vectorised on gathered tags, vectorised on a map of the pool
@pytest.mark.parametrize(("n", "capacity"), [(3, 256), (20, 256), (120, 2048), (200, 256)])
def test_pool_refuses_a_page_named_twice_foreign_or_out_of_range_and_changes_nothing(n, capacity):
    pool = PagePool(FULL_KV, 4, capacity, PageLayout())
    pages = pool.alloc(n, REQ).tolist()
    theirs, unused = pool.alloc(1, OTHER).tolist(), capacity - 1
    kinds, ids = pool.owner_kind.copy(), pool.owner_id.copy()
    wraps = pages[0] - capacity  # negative, and would index one of ours not named
    # named twice, negative (wrapping), past the end, free, someone else's
    for odd in (pages[1], wraps, capacity, unused, *theirs):
        for call in (pool.free, lambda p, o: pool.transfer(p, o, OTHER)):
            with pytest.raises(OwnershipError):
                call(np.array([*pages[1:], odd]), REQ)
            assert pool.free_count == capacity - 1 - n
            assert (pool.owner_kind == kinds).all() and (pool.owner_id == ids).all()
    pool.transfer(pages, REQ, OTHER)
    assert (pool.owner_id[pages] == OTHER.id).all() and (pool.owner_kind[pages] == 2).all()
    pool.free([*pages, *theirs], OTHER)
    assert pool.free_count == capacity and (pool.owner_id == -1).all()
    assert (pool.owner_kind == 0).all()
    assert pool.alloc(capacity, REQ).tolist() == list(range(capacity))  # the stack is whole


def test_pool_exhaustion_is_a_clear_error_and_changes_nothing():
    pool = PagePool(SWA_WINDOW, 4, 4, PageLayout())
    pool.alloc(3, REQ)
    with pytest.raises(
        PoolExhausted, match=r"swa.window \(device\) is out of pages: needed 2, free 1 of 4"
    ):
        pool.alloc(2, REQ)
    assert pool.free_count == 1


def test_pool_tokens_cross_page_boundaries():
    pool = PagePool(FULL_KV, 4, 8, PageLayout((2,), torch.float64))
    pages = pool.alloc(3, REQ).tolist()
    values = torch.arange(20, dtype=torch.float64).reshape(10, 2)
    pool.write_tokens(pages, 1, values)
    assert torch.equal(pool.read_tokens(pages, 1, 10), values)
    assert torch.equal(pool.page_data([pages[1]])[0], values[3:7])


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])  # numpy's view, torch alone
def test_pool_whole_pages_read_write_and_copy_like_single_tokens(dtype):
    pool = PagePool(FULL_KV, 4, 8, PageLayout((2,), dtype))
    assert (pool._host is None) == (dtype is torch.bfloat16)
    for pages in ([1, 2, 3], [5, 2, 6]):  # consecutive ids, and scattered ones
        values = torch.arange(24, dtype=dtype).reshape(12, 2) + pages[0]
        pool.write_tokens(np.array(pages), 0, values)
        got = pool.read_tokens(pages, 0, 12)
        assert torch.equal(got, values) and torch.equal(pool.read_tokens(pages, 1, 6), values[1:7])
        got += 1  # a copy: the pool keeps its values
        assert torch.equal(pool.read_tokens(pages, 0, 12), values)
    for src, dst in (([1, 2], [2, 3]), ([3, 4], [2, 3]), ([5, 2], [1, 0])):  # overlapping too
        before = pool.data.clone()
        pool.copy_pages(np.array(src), pool, np.array(dst))
        assert torch.equal(pool.page_data(dst), before[src])
    pool.set_page_data(np.array([7, 0]), 3)
    pool.write_tokens([6, 7], 0, torch.ones(8, 2))  # float32 values, converted
    assert (pool.page_data([0]) == 3).all() and (pool.read_tokens([6, 7], 0, 8) == 1).all()


# -- RadixTree ----------------------------------------------------------------------------
def tree_with(*seqs: list[int]) -> RadixTree:
    tree = RadixTree(page_size=2)
    next_page = iter(range(1000))
    for seq in seqs:
        node, pos = tree.root, 0
        while pos < len(seq):
            child = tree.child(node, None, seq, pos)
            if child is None:
                pages = np.array([next(next_page) for _ in range((len(seq) - pos) // 2)])
                child = tree.add_leaf(node, seq[pos:], pages, None)
            elif (n := tree.matching_pages(child, seq, pos, len(seq))) * 2 < len(child.tokens):
                child = tree.split(child, n)
            node, pos = child, child.depth
    return tree


def test_split_keeps_identity_depth_and_refs():
    tree = tree_with([1, 2, 3, 4, 5, 6])
    leaf = tree.walk([1, 2, 3, 4, 5, 6], None, 6).nodes[-1]
    tree.lock(leaf)
    upper = tree.split(leaf, 1)
    assert (upper.depth, leaf.depth, leaf.start) == (2, 6, 2)
    assert upper.refs == leaf.refs == 1 and tree.root.refs == 1
    assert leaf.parent is upper and upper.pages.tolist() == [0] and leaf.pages.tolist() == [1, 2]


def test_walk_counts_pages_matched_inside_a_diverging_node():
    tree = tree_with([1, 2, 3, 4, 5, 6])
    walk = tree.walk([1, 2, 3, 4, 9, 9, 9], None, 7)
    assert walk.nodes == [] and walk.hit_len == 4
    assert tree.walk([1, 2, 3, 4, 5, 6, 7], None, 7).hit_len == 6


def test_matching_pages_finds_the_first_differing_page_wherever_it_is():
    tree = RadixTree(page_size=4)
    node = tree.add_leaf(tree.root, list(range(52)), np.arange(13), None)
    for differ in [*range(52), None]:  # every token of the node, and none
        for pos, limit in ((0, 60), (0, 52), (0, 20), (0, 50), (4, 60), (8, 36)):
            tokens = [-9] * pos + list(range(60))
            if differ is not None:
                tokens[pos + differ] = -1
            expect = 0  # page by page, as a reference
            while (
                expect * 4 < min(52, limit - pos)
                and node.tokens[expect * 4 : expect * 4 + 4]
                == tokens[pos + expect * 4 : pos + expect * 4 + 4]
            ):
                expect += 1
            assert tree.matching_pages(node, tokens, pos, limit) == expect, (differ, pos, limit)


def test_extra_key_separates_namespaces():
    tree = RadixTree(page_size=2)
    tree.add_leaf(tree.root, [1, 2], np.array([0]), "a")
    assert tree.walk([1, 2, 3], "a", 3).hit_len == 2
    assert tree.walk([1, 2, 3], None, 3).hit_len == 0
    assert tree.walk([1, 2, 3], "b", 3).hit_len == 0


def test_lock_covers_the_path_and_eviction_goes_lru_leaf_first():
    tree = tree_with([1, 1, 2, 2], [1, 1, 3, 3])
    a = tree.walk([1, 1, 2, 2], None, 4).nodes[-1]
    b = tree.walk([1, 1, 3, 3], None, 4).nodes[-1]
    tree.touch(b)  # a is now the least recently used leaf
    tree.lock(b)
    assert a in tree.evictable and b not in tree.evictable and tree.root.refs == 1
    taken = []
    assert tree.evict(10, lambda n: taken.append(n.id) or len(n.pages)) == 1
    assert taken == [a.id]  # b is locked, and the shared parent is not a leaf
    tree.unlock(b)
    tree.evict(10, lambda n: taken.append(n.id) or len(n.pages))
    assert tree.node_count == 0 and tree.root not in tree.evictable


def test_evicting_more_than_the_tree_holds_takes_what_the_lru_walk_takes():
    seqs = ([1, 1, 2, 2, 3, 3], [1, 1, 2, 2, 4, 4, 5, 5], [1, 1, 6, 6], [7, 7, 8, 8])
    seqs += ([9, 9, 10, 10], [9, 9, 11, 11])  # a parent that becomes a leaf on the way
    taken: dict[str, list[int]] = {}
    for how in ("lru", "all"):
        tree = tree_with(*seqs)
        tree.lock(tree.walk([1, 1, 2, 2, 4, 4, 5, 5], None, 8).nodes[-1])
        tree.add_host_ref(tree.walk([7, 7, 8, 8], None, 4).nodes[-1])
        assert tree.page_count == 11
        taken[how] = []
        wanted = 5 if how == "lru" else 12  # exactly what can go, or more than the tree holds
        got = tree.evict(wanted, lambda n: taken[how].append(n.id) or len(n.pages))  # noqa: B023
        assert got == 5 and tree.page_count == 6 and tree.node_count == 4 and not tree.evictable
    assert sorted(taken["lru"]) == sorted(taken["all"]) and len(taken["all"]) == 5


def test_host_ref_pins_a_node_against_eviction():
    tree = tree_with([1, 1, 2, 2])
    leaf = tree.walk([1, 1, 2, 2], None, 4).nodes[-1]
    tree.add_host_ref(leaf)
    assert tree.evict(10, lambda n: len(n.pages)) == 0
    tree.drop_host_ref(leaf)
    assert tree.evict(10, lambda n: len(n.pages)) == 2


# -- HybridPrefixCache -------------------------------------------------------------------
def test_capture_points_mark_intervals_and_the_frontier_page():
    cache = build_cache(small_config(), INT_LAYOUTS)
    h = cache.open([])
    assert cache.capture_points(h, 0, 3) == []
    assert cache.capture_points(h, 0, 7) == [(4, PendingKind.TRACK)]
    assert cache.capture_points(h, 10, 37) == [
        (16, PendingKind.INTERVAL),
        (32, PendingKind.INTERVAL),
        (36, PendingKind.TRACK),
    ]
    assert cache.capture_points(h, 15, 16) == [(16, PendingKind.INTERVAL)]


def test_match_leaves_the_last_token_to_compute():
    cache = build_cache(small_config(), INT_LAYOUTS)
    sim = SimRunner(cache)
    h = cache.open(list(range(8)))
    cache.match(h)
    run_turn(sim, h, [], chunk=8, decode=[])
    cache.release(h, commit=True)
    # The same prompt again: token 7 must be computed to yield logits, so the
    # history match stops at 4, where no snapshot exists: nothing to resume from.
    # The prompt agrees with the cache to its last token all the same (branch_len).
    assert cache.match(cache.open(list(range(8)))) == Match(4, 0, branch_len=8)
    # One more token and the turn's terminal snapshot at 8 is usable.
    assert cache.match(cache.open([*range(8), 9])) == Match(8, 8, branch_len=8)


def test_allocation_failure_is_atomic():
    cache = build_cache(
        small_config(swa_kv=GroupSpec(name=SWA_KV, page_size=4, capacity=4)), INT_LAYOUTS
    )
    h = cache.open(list(range(40)))
    cache.match(h)
    before = {g: p.free_count for g, p in cache.pools.items()}
    with pytest.raises(PoolExhausted, match=r"swa\.kv"):
        cache.allocate(h, 24)  # full.kv has room, swa.kv does not
    assert {g: p.free_count for g, p in cache.pools.items()} == before
    assert h.allocated_len == 0 and audit(cache.view).clean


def test_window_slides_and_trim_keeps_a_partial_page():
    cache = build_cache(small_config(), INT_LAYOUTS)
    sim = SimRunner(cache)
    h = cache.open(list(range(30)))
    cache.match(h)
    sim.compute(h, 22)
    assert sorted(holder_of(h).swa_pages) == [
        3,
        4,
        5,
    ]  # positions >= 22 - 8 = 14 live in pages 3..5
    cache.allocate(h, 5)  # speculative slots for positions 22..26; one is accepted
    sim.write(h, 22, torch.tensor(sim.values(h)[22:23]))
    cache.advance(h, 23)
    cache.pools[LINEAR_STATE].set_page_data(holder_of(h).working[LINEAR_STATE], sim.values(h)[22])
    cache.trim(h, 23)
    assert (
        len(holder_of(h).full_pages) == 6 and h.allocated_len == 23
    )  # page 5 holds 20..22 and stays
    sim.check_holder(h)
    assert audit(cache.view).clean


def test_retract_parks_the_recovery_snapshot_on_the_host():
    cache = build_cache(small_config(), INT_LAYOUTS)
    sim = SimRunner(cache)
    h = cache.open(list(range(20)))
    cache.match(h)
    run_turn(sim, h, [], chunk=6, decode=[])
    cache.retract(h)
    anchor = holder_of(h).anchor
    assert h.status is HolderStatus.RETRACTED and anchor.depth == 20 and anchor.host_refs == 1
    assert anchor.snapshot.tier is Tier.HOST
    usage = group_usage(cache.view)
    assert usage[LINEAR_STATE].by_owner == {
        "tree": 0,
        "request": 0,
        "session": 0,
        "slot": 0,
        "host": 1,
        "host_evictable": 0,  # the retracted request recovers from it: pinned
    }
    holder_of(h).tokens.append(7)
    assert cache.match(h).resume_len == 20
    assert anchor.snapshot.tier is Tier.DEVICE and anchor.host_refs == 0
    sim.check_holder(h)
    assert audit(cache.view).clean


def test_a_host_snapshot_no_request_will_recover_from_is_host_evictable():
    """Aborted while retracted, a request leaves its recovery snapshot on the host tier
    as cache: still host pages, but evictable ones, and the pool gauge's ``host``
    state (what a black-box gate wants back at its level) no longer counts them."""
    from kvwatch.instrumentation.metrics import _pool_pages

    cache = build_cache(small_config(), INT_LAYOUTS)
    sim = SimRunner(cache)
    h = cache.open(list(range(20)))
    cache.match(h)
    run_turn(sim, h, [], chunk=6, decode=[])
    cache.retract(h)
    anchor = holder_of(h).anchor
    pinned = group_usage(cache.view)[LINEAR_STATE].by_owner
    assert (pinned["host"], pinned["host_evictable"]) == (1, 0)
    cache.release(h, commit=False)
    assert anchor.snapshot.tier is Tier.HOST and anchor.host_refs == 0
    cached = group_usage(cache.view)[LINEAR_STATE].by_owner
    assert (cached["host"], cached["host_evictable"]) == (1, 1)
    stats = take_stats(cache.reads, 0, QueueReport(waiting=0, running=0, retracted=0, paused=0))
    gauge = {
        o.attributes["state"]: o.value
        for o in _pool_pages(stats)
        if o.attributes["group"] == LINEAR_STATE
    }
    assert (gauge["host"], gauge["host_evictable"]) == (0, 1)
    assert audit(cache.view).clean


def test_group_usage_splits_pinned_and_evictable_tree_pages():
    cache = build_cache(small_config(), INT_LAYOUTS)
    sim = SimRunner(cache)
    a, b = cache.open(list(range(17))), cache.open([9] * 17)
    for h in (a, b):
        cache.match(h)
        run_turn(sim, h, [], chunk=8, decode=[])
    cache.release(b, commit=True)
    usage = group_usage(cache.view)[FULL_KV]
    assert usage.by_owner["tree"] == 8 and usage.by_owner["request"] == 1
    assert usage.evictable == 4  # b's path; a's is locked
    assert usage.capacity - usage.free == 9


def test_config_rejects_bad_geometry():
    with pytest.raises(ValueError, match="snapshot_interval"):
        CacheConfig(snapshot_interval=24)
    with pytest.raises(ValueError, match="page_size must be 1"):
        GroupSpec(name=LINEAR_STATE, page_size=2, capacity=8)
    with pytest.raises(ValueError, match="only state groups have a host tier"):
        GroupSpec(name=FULL_KV, page_size=16, capacity=8, host_capacity=4)
    with pytest.raises(ValueError, match="must hold at least a working state"):
        small_config(linear_state=GroupSpec(name=LINEAR_STATE, page_size=1, capacity=1))


def test_root_has_no_pages():
    tree = RadixTree(page_size=4)
    assert tree.root.pages is EMPTY_PAGES and tree.root.depth == 0 and tree.root.is_leaf


def test_a_prompt_leaving_the_tree_without_state_there_captures_it_for_its_siblings():
    """Branch capture: the tree has history to 12 but state only at 24 (a deeper
    terminal); a prompt that leaves at 12 recomputes from 0, captures a BRANCH
    snapshot at 12 and commits it, and the next sibling resumes there."""
    cache = build_cache(small_config(), INT_LAYOUTS)
    sim = SimRunner(cache)
    seeder = cache.open([*range(25)])
    cache.match(seeder)
    run_turn(sim, seeder, [], chunk=8, decode=[])
    cache.release(seeder, commit=True)  # state only at its terminal, 24 (interval 16 superseded)
    first = cache.open([*range(12), 90, 91, 92, 93, 94])
    m = cache.match(first)
    assert (m.hit_len, m.resume_len, holder_of(first).branch_at) == (12, 0, 12)
    assert (12, PendingKind.BRANCH) in cache.capture_points(first, 8, 16)
    run_turn(sim, first, [], chunk=8, decode=[])
    branch = next(n for n in holder_of(first).lock_node.path() if n.depth == 12)
    assert len(branch.children) == 2 and branch.has_complete_snapshot
    cache.release(first, commit=True)
    second = cache.open([*range(12), 80, 81, 82, 83, 84])
    assert cache.match(second).resume_len == 12  # resumes at the branch, recomputes nothing before
    run_turn(sim, second, [], chunk=8, decode=[])
    assert branch.has_complete_snapshot  # three children now, still kept
    cache.release(second, commit=True)
    assert audit(cache.view).clean


@pytest.mark.parametrize("leak", [False, True])
def test_probe_counts_only_superseded_interior_snapshots(leak):
    """A branch point's state and a path's deepest state are kept on purpose; a turn
    end that a later turn's terminal supersedes is what seed 000 leaks."""
    faults = frozenset({Fault.INTERIOR_SNAPSHOT_LEAK}) if leak else frozenset()
    cache = build_cache(small_config(), INT_LAYOUTS, faults=faults)
    sim = SimRunner(cache)
    for tail in ([90, 91, 92, 93, 94], [80, 81, 82, 83, 84]):  # two branches at 12
        h = cache.open([*range(12), *tail])
        cache.match(h)
        run_turn(sim, h, [], chunk=8, decode=[])
        if tail[0] == 90:
            cache.release(h, commit=True)
    run_turn(sim, h, [7] * 9, chunk=8, decode=[])  # a second turn on the second branch
    run_turn(sim, h, [6] * 9, chunk=8, decode=[])  # and a third
    cache.release(h, commit=True)
    interior = take_stats(
        cache.reads, 0, QueueReport(waiting=0, running=0, retracted=0, paused=0)
    ).tree.interior_snapshots
    assert (max(interior.values()) > 0) is leak, interior
    assert audit(cache.view).clean


def test_shared_snapshot_lives_while_shared_and_goes_when_the_sharer_leaves():
    cache = build_cache(small_config(), INT_LAYOUTS)
    sim = SimRunner(cache)
    seeder = cache.open([*range(20), 0])
    cache.match(seeder)
    run_turn(sim, seeder, [], chunk=8, decode=[])
    cache.release(seeder, commit=True)
    a, b = cache.open([*range(20), 1]), cache.open([*range(20), 2])
    assert cache.match(a).resume_len == cache.match(b).resume_len == 20
    shared = holder_of(a).lock_node
    run_turn(sim, a, [5] * 10, chunk=8, decode=[])
    run_turn(sim, b, [6] * 10, chunk=8, decode=[])
    assert shared.refs == 2 and shared.has_complete_snapshot  # kept for the sharer
    first_terminal = holder_of(a).lock_node
    cache.release(b, commit=True)
    # b's turn stays cached as a sibling leaf: the branch point's state is where
    # a third conversation would resume, so it stays though a alone locks it
    assert shared.refs == 1 and len(shared.children) == 2 and shared.has_complete_snapshot
    # once b's leaf is evicted it is no branch point, and a's own terminal supersedes
    # it: it goes at once, not at a's next commit, so no probe sees a holder pinning
    # three snapshots
    assert cache._store.evict(FULL_KV, 1) >= 1
    assert len(shared.children) == 1
    assert shared.snapshot.history_only and first_terminal.has_complete_snapshot
    run_turn(sim, a, [7] * 10, chunk=8, decode=[])
    assert first_terminal.snapshot.history_only
    assert holder_of(a).lock_node.has_complete_snapshot  # the deepest anchor always stays
    assert audit(cache.view).clean
