"""The probe: a frozen, JSON-ready report of the engine at a step boundary.

It only reads: pool usage by owner, the audit's findings, the root's refs,
tree size and the usage bounds that live holders justify. ``EngineStats`` is
the same minus the audit and the bounds, cheap enough for every scrape. The
records themselves are the probe contract, ``kvwatch.contracts``.
"""

from __future__ import annotations

from kvwatch.contracts import (
    EngineStats,
    Finding,
    FindingKind,
    GroupReport,
    ProbeReport,
    QueueReport,
    RootRefs,
    SlotReport,
    TreeReport,
    finding,
)
from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.holder import HolderStatus
from kvwatch.engine.cache.hybrid import HybridPrefixCache
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import OwnerKind
from kvwatch.engine.cache.usage import GroupUsage, group_usage, usage_bounds
from kvwatch.engine.config import STATE_GROUPS

__all__ = ["EngineStats", "ProbeReport", "QueueReport", "take_probe", "take_stats"]


def _superseded(node: Node) -> bool:
    """Whether a deeper snapshot on the same unbranched path makes ``node``'s
    state redundant: the snapshots seed 000 leaks. A branch point's state (kept
    for the siblings) and the deepest state of a path are not superseded."""
    while len(node.children) == 1:
        node = next(iter(node.children.values()))
        if node.has_complete_snapshot:
            return True
    return False


def take_stats(
    cache: HybridPrefixCache,
    step: int,
    queue: QueueReport,
    *,
    live_sessions: int = 0,
    record_bytes: int = 0,
    usage: dict[str, GroupUsage] | None = None,
) -> EngineStats:
    usage = usage if usage is not None else group_usage(cache)
    groups = {
        name: GroupReport(u.family, u.capacity, u.free, u.by_owner, u.evictable, u.host_capacity)
        for name, u in usage.items()
    }
    snapshots = dict.fromkeys(STATE_GROUPS, 0)
    interior = dict.fromkeys(STATE_GROUPS, 0)
    on_host = 0
    for node in cache.tree.snapshot_nodes:
        on_host += node.snapshot.tier is Tier.HOST
        for group in node.snapshot.pages:
            snapshots[group] += 1
            interior[group] += _superseded(node)
    tree = TreeReport(
        cache.tree.node_count,
        snapshots,
        on_host,
        interior,
        cache.tree.page_count * cache.tree.page_size,
    )
    locked = sum(h.lock_node is not None for h in cache.holders.values())
    live = queue.waiting + queue.running + queue.retracted + queue.paused
    slots = None
    if (table := cache.slots) is not None:
        lengths = tuple(s.length for s in table.slots)
        filled = sum(not s.empty for s in table.slots)
        slots = SlotReport(len(lengths), filled, len(table.entries), table.next_slot, lengths)
    root = RootRefs(cache.tree.root.refs, locked)
    return EngineStats(step, live, live_sessions, groups, root, tree, queue, record_bytes, slots)


def _stopped_commits(cache: HybridPrefixCache) -> list[Finding]:
    """Running requests whose commit stopped short of the pages they computed.

    A probe runs at a step boundary, and every step ends with ``commit_chunk``
    for each request it computed, which reaches the last full page computed.
    A request still short of it was stopped by a node on its path (the
    history-only anchor of seed 000) and keeps those pages to itself.
    """
    if not cache.radix:
        return []
    p, out = cache.page_size, []
    for h in cache.holders.values():
        committable = h.computed_len - h.computed_len % p
        running = h.status is HolderStatus.ACTIVE and h.owner.kind is OwnerKind.REQUEST
        if running and h.cached_len < committable:
            detail = f"{h.owner}: commit stopped at {h.cached_len} of {committable} tokens"
            out.append(finding(FindingKind.TREE, None, [], detail))
    return out


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
    findings = report.findings + tuple(_stopped_commits(cache))
    usage = group_usage(cache)  # one reading serves the stats and the bounds
    stats = take_stats(
        cache, step, queue, live_sessions=live_sessions, record_bytes=record_bytes, usage=usage
    )
    # a probe's root refs are the audit's: the expected count recomputed from live holders
    stats = stats._replace(root_refs=report.root_refs)
    return ProbeReport(stats, findings, usage_bounds(cache, slack_tokens, usage))
