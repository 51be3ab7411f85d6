"""What the report draws, read out of a run's record and its performance figures.

Pure functions, no plotting: the figures (``report_plots.py``) and the page
(``report.py``) only lay these out. Turns keep the numbers the record and
summary.json give them; the probe before the load sits one position before
the first turn and the drained probe one after the last, which is where
summary.json puts a failure found after the drain (``first_turn`` one past
the last turn).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from kvwatch.contracts import FindingKind, ProbeReport
from kvwatch.gate.verdicts.detectors.story import over_bound, pages_found
from kvwatch.gate.verdicts.performance import Performance
from kvwatch.harness.run_record import RunRecord

# pool stack, bottom to top: what live holders pin, then the tree's cache
# (pinned where a lock or an anchor keeps it, evictable otherwise)
STACK = ("session", "request", "slot", "tree, pinned", "tree, evictable", "untagged")
PERCENTILES = ("50%", "90%", "99%")


class PoolPoint(NamedTuple):
    """One group at one position of the pool plot."""

    x: int  # the turn number; before the load: first turn - 1; drained: last turn + 1
    label: str  # "before", the turn number, "drained"
    stack: dict[str, int]  # device pages per STACK entry
    host: int  # pages of this group in the host tier
    leaked: int  # pages held by no live holder (orphan findings), most at any probe here
    over_bound: int  # pinned pages beyond what live holders justify, most at any probe here


class GroupSeries(NamedTuple):
    group: str
    capacity: int
    points: tuple[PoolPoint, ...]

    @property
    def held(self) -> bool:
        """Whether anything, on device, on host or leaked, was held at any position."""
        return any(sum(p.stack.values()) or p.host or p.leaked for p in self.points)


def leaked_pages(probe: ProbeReport, group: str) -> int:
    """Pages of ``group`` the audit found held by no live holder (orphans)."""
    return pages_found(probe, FindingKind.ORPHAN, group)


def _stack(probe: ProbeReport, group: str) -> tuple[dict[str, int], int]:
    g = probe.groups[group]
    owners = g.by_owner
    tree = owners.get("tree", 0)
    evictable = min(g.evictable, tree)
    stack = {
        "session": owners.get("session", 0),
        "request": owners.get("request", 0),
        "slot": owners.get("slot", 0),
        "tree, pinned": tree - evictable,
        "tree, evictable": evictable,
    }
    # pages allocated but tagged for no owner (an orphan may carry no tag)
    stack["untagged"] = max(g.used - sum(stack.values()), 0)
    return stack, owners.get("host", 0)


def _point(x: int, label: str, shown: ProbeReport, probes: Iterable[ProbeReport], group: str):
    probes = list(probes)
    stack, host = _stack(shown, group)
    return PoolPoint(
        x=x,
        label=label,
        stack=stack,
        host=host,
        leaked=max(leaked_pages(p, group) for p in probes),
        over_bound=max(over_bound(p, group) for p in probes),
    )


def pool_series(record: RunRecord) -> list[GroupSeries]:
    """Per group: the barrier probe of each turn (leaks: the most any probe of
    the turn saw), with the probe before the load and the drained probe around them."""
    turns = [t for t in record.turns if t.barrier is not None]
    if not turns:
        return []
    first, last = turns[0].turn, turns[-1].turn
    out = []
    for group, g in turns[0].barrier.groups.items():
        points = []
        if record.baseline is not None and group in record.baseline.groups:
            b = record.baseline
            points.append(_point(first - 1, "before", b, [b], group))
        points += [_point(t.turn, str(t.turn), t.barrier, t.probes, group) for t in turns]
        if record.drained is not None and group in record.drained.groups:
            d = record.drained
            points.append(_point(last + 1, "drained", d, [d], group))
        out.append(GroupSeries(group, g.capacity, tuple(points)))
    return out


class StepSeries(NamedTuple):
    """Every probe of a run, in engine steps: the probes carry their step, not a clock."""

    steps: tuple[int, ...]
    used: dict[str, tuple[float, ...]]  # per group: used pages, % of its capacity
    capacity: dict[str, int]
    barriers: tuple[tuple[int, int], ...]  # (turn, step of its barrier probe)
    flagged: tuple[int, ...]  # steps whose probe found pages held by no live holder


def step_series(record: RunRecord) -> StepSeries | None:
    probes = [(t.turn, p) for t in record.turns for p in t.probes]
    if not probes:
        return None
    groups = probes[0][1].groups
    used = {
        name: tuple(100.0 * p.groups[name].used / max(g.capacity, 1) for _, p in probes)
        for name, g in groups.items()
        if any(p.groups[name].used for _, p in probes)
    }
    return StepSeries(
        steps=tuple(p.step for _, p in probes),
        used=used,
        capacity={name: g.capacity for name, g in groups.items()},
        barriers=tuple((t.turn, t.barrier.step) for t in record.turns if t.barrier is not None),
        flagged=tuple(p.step for _, p in probes if any(leaked_pages(p, g) for g in groups)),
    )


def latency_series(
    performance: Mapping[int, Performance | None],
) -> dict[str, dict[int, tuple[float, ...]]]:
    """TTFT, ITL and end to end: p50, p90 and p99 in ms at each concurrency, from
    the gate's own measurements (``verdicts/performance.py``); all NaN where a run has none."""
    missing = (math.nan,) * len(PERCENTILES)
    out = {}
    for label, field in (("TTFT", "ttft"), ("ITL", "itl"), ("end to end", "e2e")):
        found = {
            c: tuple(v * 1000 for v in got) if (got := getattr(perf, field, None)) else missing
            for c, perf in performance.items()
        }
        if any(v is not missing for v in found.values()):
            out[label] = dict(sorted(found.items()))
    return out
