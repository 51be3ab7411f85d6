"""What the report draws, read out of a run's record and Locust's stats CSV.

Pure functions, no plotting: the figures (``report_plots.py``) and the page
(``report.py``) only lay these out. Turns keep the numbers the record and
summary.json give them; the probe before the load sits one position before
the first turn and the drained probe one after the last, which is where
summary.json puts a failure found after the drain (``first_turn`` one past
the last turn).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from kvwatch.contracts import FindingKind, ProbeReport
from kvwatch.gate.detectors.story import over_bound, pages_found
from kvwatch.gate.run_record import RunRecord

# pool stack, bottom to top: what live holders pin, then the tree's cache
# (pinned where a lock or an anchor keeps it, evictable otherwise)
STACK = ("session", "request", "slot", "tree, pinned", "tree, evictable", "untagged")
PERCENTILES = ("50%", "90%", "99%")
TIMINGS = ("TTFT", "ITL")  # Locust rows that time a stream, not a request


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


class StatsRow(NamedTuple):
    kind: str  # Locust's Type column: POST, GET, TTFT, ITL ...
    name: str
    count: int
    percentiles: tuple[float, ...]  # PERCENTILES in ms, NaN where Locust has none


def _ms(cell: str | None) -> float:
    try:
        return float(cell) if cell not in (None, "", "N/A") else math.nan
    except ValueError:
        return math.nan


def read_stats(path: Path) -> list[StatsRow]:
    """Locust's ``locust_stats.csv`` without its Aggregated row ([] when absent)."""
    if not path.exists():
        return []
    with path.open() as f:
        return [
            StatsRow(
                kind=r["Type"],
                name=r["Name"],
                count=int(r["Request Count"] or 0),
                percentiles=tuple(map(_ms, (r.get(p) for p in PERCENTILES))),
            )
            for r in csv.DictReader(f)
            if r["Name"] != "Aggregated"
        ]


def busiest(stats: Mapping[int, list[StatsRow]], timing: str | None) -> tuple[str, str] | None:
    """The (type, name) with the most requests over every concurrency together:
    one choice for the whole profile. ``timing``: TTFT or ITL rows, None: requests.
    Ties go to a POST (a generation, whose latency is the one that matters; a
    streaming session's turns tie with its session reads), then to the first
    name in sort order, so the choice never depends on row order."""
    counts: dict[tuple[str, str], int] = {}
    for rows in stats.values():
        for r in rows:
            if (r.kind == timing) if timing else r.kind not in TIMINGS:
                counts[(r.kind, r.name)] = counts.get((r.kind, r.name), 0) + r.count
    if not counts:
        return None
    return min(counts, key=lambda k: (-counts[k], k[0] != "POST", k))


def latency_series(stats: Mapping[int, list[StatsRow]]) -> dict[str, dict[int, tuple[float, ...]]]:
    """Per chosen row (the busiest request, TTFT and ITL name of the profile):
    its percentiles at each concurrency, all NaN where that run has no such row."""
    out = {}
    for timing in (None, *TIMINGS):
        key = busiest(stats, timing)
        if key is None:
            continue
        missing = (math.nan,) * len(PERCENTILES)
        found = {
            c: next((r.percentiles for r in rows if (r.kind, r.name) == key), missing)
            for c, rows in stats.items()
        }
        out[f"{key[0]} {key[1]}"] = dict(sorted(found.items()))
    return out
