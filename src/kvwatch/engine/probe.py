"""The probe: a frozen, JSON-ready report of the engine at a step boundary.

It only reads: pool usage by owner, the audit's findings, the root's refs,
tree size and the usage bounds that live holders justify. ``EngineStats`` is
the same minus the audit and the bounds, cheap enough for every scrape. The
records themselves are the probe contract, ``kvwatch.contracts``.
"""

from __future__ import annotations

from kvwatch.contracts import (
    EngineStats,
    FindingKind,
    GroupReport,
    ProbeReport,
    QueueReport,
    RootRefs,
    SlotReport,
    TreeReport,
    finding,
)
from kvwatch.engine.cache.protocol import AuditableCache
from kvwatch.engine.cache.usage import GroupUsage

__all__ = ["EngineStats", "ProbeReport", "QueueReport", "take_probe", "take_stats"]


def _stats(
    step: int,
    queue: QueueReport,
    usage: dict[str, GroupUsage],
    structure: tuple[TreeReport, SlotReport | None, RootRefs],
    *,
    live_sessions: int,
    record_bytes: int,
    sessions_closed: int = 0,
) -> EngineStats:
    groups = {
        name: GroupReport(
            family=u.family,
            capacity=u.capacity,
            free=u.free,
            by_owner=u.by_owner,
            evictable=u.evictable,
            host_capacity=u.host_capacity,
        )
        for name, u in usage.items()
    }
    tree, slots, root = structure
    live = queue.waiting + queue.running + queue.retracted + queue.paused
    return EngineStats(
        step=step,
        live_requests=live,
        live_sessions=live_sessions,
        groups=groups,
        root_refs=root,
        tree=tree,
        queue=queue,
        record_bytes=record_bytes,
        slots=slots,
        sessions_closed=sessions_closed,
    )


def take_stats(
    cache: AuditableCache,
    step: int,
    queue: QueueReport,
    *,
    live_sessions: int = 0,
    record_bytes: int = 0,
    sessions_closed: int = 0,
) -> EngineStats:
    """Usage, tree and queue figures without the audit: cheap, for every scrape."""
    return _stats(
        step,
        queue,
        cache.usage(),
        cache.structure(),
        live_sessions=live_sessions,
        record_bytes=record_bytes,
        sessions_closed=sessions_closed,
    )


def take_probe(
    cache: AuditableCache,
    step: int,
    queue: QueueReport,
    *,
    slack_tokens: int = 0,
    live_sessions: int = 0,
    record_bytes: int = 0,
    sessions_closed: int = 0,
) -> ProbeReport:
    """Everything at one moment: the audit, usage and bounds from one reading.

    A commit that stopped short (``stopped_commits``) is a tree finding.
    """
    r = cache.probe(slack_tokens)
    stopped = tuple(finding(FindingKind.TREE, None, [], d) for d in r.stopped_commits)
    # a probe's root refs are the audit's: the expected count recomputed from live holders
    stats = _stats(
        step,
        queue,
        r.usage,
        (r.tree, r.slot_report, r.root_refs),
        live_sessions=live_sessions,
        record_bytes=record_bytes,
        sessions_closed=sessions_closed,
    )
    return ProbeReport(stats=stats, findings=r.audit.findings + stopped, bounds=r.bounds)
