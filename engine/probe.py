"""The probe: a frozen, JSON-ready report of the engine at a step boundary.

It only reads: pool usage by owner, the audit's findings, the root's refs,
tree size and the usage bounds that live holders justify. ``EngineStats`` is
the same minus the audit and the bounds, cheap enough for every scrape.
"""

from __future__ import annotations

from typing import NamedTuple

from kvwatch.engine.cache.audit import RootRefs, audit
from kvwatch.engine.cache.findings import Finding
from kvwatch.engine.cache.hybrid import HybridPrefixCache
from kvwatch.engine.cache.node import Tier
from kvwatch.engine.cache.usage import Bound, group_usage, usage_bounds
from kvwatch.engine.config import STATE_GROUPS


class GroupReport(NamedTuple):
    family: str
    capacity: int
    free: int
    by_owner: dict[str, int]  # tree, request, session, slot; host: pages in the host tier
    evictable: int
    host_capacity: int


class TreeReport(NamedTuple):
    nodes: int
    snapshots: dict[str, int]  # nodes holding state, per state group
    host_snapshots: int
    # snapshots on nodes with children: what superseded-snapshot release
    # should keep near zero once nobody runs (seed 000)
    interior_snapshots: dict[str, int]


class SlotReport(NamedTuple):
    """The ``slots`` backend's table: filled slots, entries and the next slot handed out."""

    slots: int
    filled: int
    entries: int
    next_slot: int
    lengths: tuple[int, ...]  # tokens held, per slot (0: empty)


class QueueReport(NamedTuple):
    waiting: int
    running: int
    retracted: int
    paused: int


class ProbeReport(NamedTuple):
    step: int
    live_requests: int
    live_sessions: int
    groups: dict[str, GroupReport]
    root_refs: RootRefs
    findings: tuple[Finding, ...]
    tree: TreeReport
    bounds: dict[str, Bound]
    queue: QueueReport
    record_bytes: int  # routed-expert blobs retained by session records
    slots: SlotReport | None = None  # only in slots mode

    @property
    def clean(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict:
        return {
            "step": self.step,
            "live_requests": self.live_requests,
            "live_sessions": self.live_sessions,
            "groups": {name: g._asdict() for name, g in self.groups.items()},
            "root_refs": self.root_refs._asdict(),
            "findings": [f.as_dict() for f in self.findings],
            "tree": self.tree._asdict(),
            "bounds": {
                name: {**b._asdict(), "exceeded": b.exceeded} for name, b in self.bounds.items()
            },
            "queue": self.queue._asdict(),
            "record_bytes": self.record_bytes,
            "slots": self.slots._asdict() if self.slots is not None else None,
        }


class EngineStats(NamedTuple):
    """The cheap part of a probe: no audit, no bounds. Gauges poll this."""

    step: int
    live_requests: int
    live_sessions: int
    groups: dict[str, GroupReport]
    root_refs: RootRefs  # expected: one per holder with a lock (every lock path ends at the root)
    tree: TreeReport
    queue: QueueReport
    record_bytes: int
    slots: SlotReport | None


def take_stats(
    cache: HybridPrefixCache,
    step: int,
    queue: QueueReport,
    *,
    live_sessions: int = 0,
    record_bytes: int = 0,
) -> EngineStats:
    groups = {
        name: GroupReport(u.family, u.capacity, u.free, u.by_owner, u.evictable, u.host_capacity)
        for name, u in group_usage(cache).items()
    }
    snapshots = dict.fromkeys(STATE_GROUPS, 0)
    interior = dict.fromkeys(STATE_GROUPS, 0)
    on_host = 0
    for node in cache.tree.snapshot_nodes:
        on_host += node.snapshot.tier is Tier.HOST
        for group in node.snapshot.pages:
            snapshots[group] += 1
            interior[group] += len(node.children) == 1  # a branch point's state is kept
    tree = TreeReport(cache.tree.node_count, snapshots, on_host, interior)
    locked = sum(h.lock_node is not None for h in cache.holders.values())
    live = queue.waiting + queue.running + queue.retracted + queue.paused
    slots = None
    if (table := cache.slots) is not None:
        lengths = tuple(s.length for s in table.slots)
        filled = sum(not s.empty for s in table.slots)
        slots = SlotReport(len(lengths), filled, len(table.entries), table.next_slot, lengths)
    root = RootRefs(cache.tree.root.refs, locked)
    return EngineStats(step, live, live_sessions, groups, root, tree, queue, record_bytes, slots)


def take_probe(
    cache: HybridPrefixCache,
    step: int,
    queue: QueueReport,
    *,
    slack_tokens: int = 0,
    live_sessions: int = 0,
    record_bytes: int = 0,
) -> ProbeReport:
    report = audit(cache)
    stats = take_stats(cache, step, queue, live_sessions=live_sessions, record_bytes=record_bytes)
    return ProbeReport(
        step,
        stats.live_requests,
        live_sessions,
        stats.groups,
        report.root_refs,
        report.findings,
        stats.tree,
        usage_bounds(cache, slack_tokens),
        queue,
        record_bytes,
        stats.slots,
    )
