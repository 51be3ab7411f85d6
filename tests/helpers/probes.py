"""Probe reports built from the contract's own types, for detector tests.

Only the fields a test cares about are arguments; the rest is an idle engine
with four empty groups.
"""

from __future__ import annotations

from kvwatch.contracts import (
    Bound,
    EngineStats,
    Finding,
    FindingKind,
    GroupReport,
    ProbeReport,
    QueueReport,
    RootRefs,
    TreeReport,
)

GROUPS = {"full.kv": "history", "swa.kv": "history", "swa.window": "state", "linear.state": "state"}
STATE = [g for g, family in GROUPS.items() if family == "state"]


def make_probe(
    *,
    findings: tuple[Finding, ...] = (),
    used: int = 0,
    exceeded: str | None = None,
    root: tuple[int, int] = (0, 0),
    interior: int = 0,
    live_requests: int = 0,
    cached_tokens: int = 0,
    step: int = 0,
) -> ProbeReport:
    """Every group of capacity 100 with ``used`` pages in the tree; the ``exceeded``
    group pins 5 pages where its holder justifies 4."""
    groups = {
        g: GroupReport(
            family=f,
            capacity=100,
            free=100 - used,
            by_owner={"tree": used},
            evictable=0,
            host_capacity=0,
        )
        for g, f in GROUPS.items()
    }
    tree = TreeReport(
        nodes=0,
        snapshots=dict.fromkeys(STATE, 0),
        host_snapshots=0,
        interior_snapshots=dict.fromkeys(STATE, interior),
        tokens=cached_tokens,
    )
    stats = EngineStats(
        step=step,
        live_requests=live_requests,
        live_sessions=0,
        groups=groups,
        root_refs=RootRefs(*root),
        tree=tree,
        queue=QueueReport(waiting=0, running=0, retracted=0, paused=0),
        record_bytes=0,
    )
    bounds = {
        g: Bound(group=g, pinned=5 if g == exceeded else 4, limit=4, shared=0, holders=1)
        for g in GROUPS
    }
    return ProbeReport(stats=stats, findings=tuple(findings), bounds=bounds)


def make_finding(kind: FindingKind, group: str | None = "full.kv") -> Finding:
    return Finding(kind=kind, group=group, pages=(7, 8), detail=f"{kind} seen")
