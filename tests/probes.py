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
) -> ProbeReport:
    """Every group of capacity 100 with ``used`` pages in the tree; the ``exceeded``
    group pins 5 pages where its holder justifies 4."""
    groups = {g: GroupReport(f, 100, 100 - used, {"tree": used}, 0, 0) for g, f in GROUPS.items()}
    tree = TreeReport(0, dict.fromkeys(STATE, 0), 0, dict.fromkeys(STATE, interior), cached_tokens)
    stats = EngineStats(
        0, live_requests, 0, groups, RootRefs(*root), tree, QueueReport(0, 0, 0, 0), 0
    )
    bounds = {g: Bound(g, 5 if g == exceeded else 4, 4, 0, 1) for g in GROUPS}
    return ProbeReport(stats, tuple(findings), bounds)


def make_finding(kind: FindingKind, group: str | None = "full.kv") -> Finding:
    return Finding(kind, group, (7, 8), f"{kind} seen")
