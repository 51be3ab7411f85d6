"""gauge-trend: black-box usage gauges, read at turn barriers, trend upward.

It needs nothing from the engine but its ``/metrics``: each series is a
gauge's rise since the run started, per live conversation, read at every
turn barrier (for kvwatch, state-group pages that eviction cannot
take back, used minus evictable; for other engines,
whatever usage gauge the preset names). Where the run recorded drain
gauges before the first turn and after it ended (black-box runs), each must
be back at its starting value. Where it read the pool gauges around the
barrier probes and on both sides of the drain's flush (kvwatch, white-box),
each must say what the probe counts, and the evictable figures what the flush
freed (``gauge_truth.py``); where it read the engine's counters before and
after the run, each must have risen by what the engine's transitions say
(``counter_truth.py``), and no latency histogram may count a request slower
than its client measured it (``latency_truth.py``).
"""

from __future__ import annotations

from kvwatch.gate.verdicts.detectors import counter_truth, gauge_truth, latency_truth
from kvwatch.gate.verdicts.detectors.stats import first_rise
from kvwatch.gate.verdicts.detectors.story import trajectory
from kvwatch.gate.verdicts.detectors.verdict import (
    Evidence,
    Verdict,
    fail,
    fail_after_drain,
    not_back,
    passed,
    skipped,
)
from kvwatch.harness.run_record import RunRecord, Signal
from kvwatch.harness.scrape import SERIES

ID = "gauge-trend"
# The number of series may end a few above its level at the end of the warm-up:
# a label set first seen in a judged turn (a finish reason no earlier request
# had) is one new series for good, not a leak; a series per request or session
# is many, and rises per conversation besides.
SLACK = {SERIES: 8}
NEEDS = frozenset({Signal.GAUGES})


def detect(run: RunRecord) -> Verdict:
    turns = [t for t in run.turns if t.gauges]
    if not turns and not gauge_truth.read(run):
        return skipped(ID, "no gauge readings")
    names = sorted({name for t in turns for name in t.gauges})
    for name in names:
        points = [(t.turn, t.gauges[name]) for t in turns if name in t.gauges]
        series = [v for _, v in points]
        rise = first_rise([turn for turn, _ in points], series, run.warmup)
        if rise is not None:
            at, trend = rise
            detail = f"{name} rises {series[0]:.3g} -> {series[-1]:.3g}: {trend.describe}"
            story = trajectory(name, points, None)
            return fail(ID, at, [Evidence(group=None, pages=(), detail=detail)])._replace(
                story=story
            )
    if (left := _not_drained(run)) is not None:
        return left
    if (lied := gauge_truth.untrue_at_barriers(run)) is not None:
        return fail(ID, lied[0], lied[1])
    if (
        lies := gauge_truth.untrue_at_flush(run)
        + counter_truth.untrue(run)
        + latency_truth.untrue(run)
    ):
        return fail_after_drain(ID, run, lies)
    checked = (
        f"; pool gauges true at {gauge_truth.read(run)} probes" if gauge_truth.read(run) else ""
    )
    return passed(ID, f"{len(names)} gauge series flat over {len(turns)} turns{checked}")


def _not_drained(run: RunRecord) -> Verdict | None:
    if not run.gauges_baseline or not run.gauges_drained:
        return None
    baseline = {k: v + SLACK.get(k, 0) for k, v in run.gauges_baseline.items()}
    left = [
        Evidence(
            group=None,
            pages=(),
            detail=f"{name} is {after:.4g} after the run, {run.gauges_baseline[name]:.4g} "
            f"before" + (f" (and {SLACK[name]} more allowed)" if name in SLACK else ""),
        )
        for name, _, after in not_back(baseline, run.gauges_drained)
    ]
    if not left:
        return None
    return fail_after_drain(ID, run, left)
