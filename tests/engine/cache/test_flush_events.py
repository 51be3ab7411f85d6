"""Evict-all (``flush``) builds eviction events only for a listener, and either way
leaves the same cache: every page the tree held free, in the same stack order,
the locked path kept, the evict set exact (the audit clean).

With a listener, each evicted node's ``NodeEvicted`` names the pages it held and
its path's key, and each snapshot it held is released with reason "flushed".
"""

from __future__ import annotations

import random

from cachesim import INT_LAYOUTS, SimRunner, cache_config, run_turn

from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.base import CacheBase
from kvwatch.engine.config import GROUP_NAMES
from kvwatch.engine.events import EventBus, NodeEvicted, SnapshotReleased

CONFIG = cache_config(window=8, interval=8, page=4, full=96, swa=64, snapshots=24)


def filled(*, keep_one: bool, events: EventBus | None = None) -> tuple[CacheBase, object]:
    """Conversations that branch off shared prefixes; ``keep_one``: the last one
    stays open (its path locked) through the flush."""
    cache = build_cache(CONFIG, INT_LAYOUTS, events=events)
    sim, rng = SimRunner(cache), random.Random(7)
    prefixes = [[rng.randrange(1000) for _ in range(12)] for _ in range(3)]
    kept = None
    for i in range(9):
        h = cache.open(prefixes[i % 3] + [rng.randrange(1000) for _ in range(6 + i)])
        cache.match(h)
        run_turn(sim, h, [], chunk=8, decode=[1, 2])
        if keep_one and i == 8:
            kept = h
        else:
            cache.release(h, commit=True)
    return cache, kept


def state(cache: CacheBase) -> dict:
    """Pools and counters; free pages as a set (a flush walks its evict set, whose
    order follows the nodes' addresses: it differs between two caches)."""
    pools = {g: cache.pools[g].snapshot() for g in GROUP_NAMES}
    return {
        g: (sorted(p.free_pages.tolist()), p.owner_kind.tolist(), p.owner_id.tolist())
        for g, p in pools.items()
    } | {"nodes": cache.view.tree.node_count, "pages": cache.view.tree.page_count}


def test_listens_follows_subscribe_and_unsubscribe():
    bus = EventBus()
    assert not bus.listens(NodeEvicted)
    off = bus.subscribe(NodeEvicted, lambda e: None)
    assert bus.listens(NodeEvicted) and not bus.listens(SnapshotReleased)
    off()
    assert not bus.listens(NodeEvicted)


def test_a_flush_with_a_listener_and_one_without_leave_the_same_cache():
    for keep_one in (False, True):
        quiet, _ = filled(keep_one=keep_one)
        bus = EventBus()
        heard, kept = filled(keep_one=keep_one, events=bus)
        evicted, released = [], []
        bus.subscribe(NodeEvicted, evicted.append)
        bus.subscribe(SnapshotReleased, released.append)
        nodes = {n.id: n for n in heard.view.tree.nodes()[1:]}
        expect = {
            n.id: (n.depth, n.pages.tolist(), heard._store.tree.path_key(n)) for n in nodes.values()
        }
        snapped = {n.id for n in nodes.values() if n.snapshot and n.snapshot.pages}
        quiet.flush()
        heard.flush()
        assert state(quiet) == state(heard)
        assert audit(quiet.view).clean and audit(heard.view).clean
        left = {n.id for n in heard.view.tree.nodes()[1:]}
        assert bool(left) == keep_one and heard.view.tree.root.refs == int(keep_one)
        gone = set(expect) - left
        assert sorted(e.node_id for e in evicted) == sorted(gone)
        for e in evicted:  # the walk's remembered path keys: a fresh climb's
            assert (e.depth, list(e.page_ids), e.path_key) == expect[e.node_id]
        by_reason = {r.node_id for r in released if r.reason == "flushed"}
        assert by_reason == snapped & gone and by_reason
        assert all(nodes[i].snapshot.history_only for i in by_reason)
        assert all(nodes[i].parent is None and not nodes[i].children for i in gone)
        if keep_one:
            heard.release(kept, commit=True)
            heard.flush()
            assert heard.view.tree.node_count == 0 and audit(heard.view).clean
        else:
            assert all(heard.pools[g].used_count == 0 for g in GROUP_NAMES)
