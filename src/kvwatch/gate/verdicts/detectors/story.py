"""How a failure grew: the failing quantity at the first turn, at the last, and after the drain.

A verdict's evidence says what was wrong where it was first seen ("1 page
held by no live holder at turn 0"); a reader also wants to know whether it
stayed at one page or grew with every turn. A detector that fails on a
quantity it can follow through the run tells that as a ``story``::

    full.kv leaked pages 1 -> 10 over turns 0-5, 10 after the drain

Each turn counts with the most any of its probes saw. Pure functions of the
run record.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from kvwatch.contracts import MAX_PAGES, FindingKind, ProbeReport
from kvwatch.gate.verdicts.detectors.verdict import new_findings
from kvwatch.harness.run_record import RunRecord

ProbeCount = Callable[[ProbeReport], float]


def _number(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"


def trajectory(label: str, points: Sequence[tuple[int, float]], drained: float | None) -> str:
    """``label first -> last over turns i-j[, d after the drain]``."""
    if not points:
        return f"{label} {_number(drained)} after the drain" if drained is not None else ""
    (t0, first), (t1, last) = points[0], points[-1]
    span = f"turn {t0}" if t0 == t1 else f"turns {t0}-{t1}"
    head = f"{label} {_number(first)} -> {_number(last)} over {span}"
    return head + (f", {_number(drained)} after the drain" if drained is not None else "")


def probe_story(label: str, run: RunRecord, count: ProbeCount) -> str:
    """``count`` at every turn (the most its probes saw) and at the drained probe."""
    points = [(t.turn, max(count(p) for p in t.probes)) for t in run.turns if t.probes]
    drained = count(run.drained) if run.drained is not None else None
    return trajectory(label, points, drained)


def pages_found(probe: ProbeReport, kind: FindingKind, group: str | None) -> int:
    """Pages of ``group`` a probe's findings of ``kind`` name. A finding keeps the
    first MAX_PAGES ids and says in its detail how many there were."""
    total = 0
    for f in probe.findings:
        if f.kind is not kind or f.group != group:
            continue
        count = len(f.pages)
        if count >= MAX_PAGES:
            said = re.search(r"(\d+) allocated pages", f.detail)
            count = max(count, int(said.group(1))) if said else count
        total += count or 1
    return total


def over_bound(probe: ProbeReport, group: str) -> int:
    """Pinned pages of ``group`` above the bound live holders justify (0 within it)."""
    bound = probe.bounds.get(group)
    return max(bound.pinned - bound.limit, 0) if bound is not None else 0


WORDS = {
    FindingKind.ORPHAN: "leaked pages",
    FindingKind.DOUBLE_OWNED: "pages held twice",
    FindingKind.FREE_AND_OWNED: "pages both free and held",
}


def finding_story(run: RunRecord, kind: FindingKind, group: str | None) -> str:
    """The pages the run's own findings of ``kind`` name (``verdict.new_findings``:
    not those an earlier run on the same engine left)."""
    words = WORDS.get(kind, f"{kind} findings")

    def own(probe: ProbeReport) -> int:
        return pages_found(probe._replace(findings=new_findings(run, probe)), kind, group)

    return probe_story(f"{group} {words}" if group else words, run, own)
