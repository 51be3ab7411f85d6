"""Leak detectors: pure functions from a recorded run to a verdict.

Ids are stable (summary.json and CI use them). Each module holds one
detector: ``detect(run: RunRecord) -> Verdict``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kvwatch.gate.detectors import (
    allocator,
    equivalence,
    gauge_trend,
    heap,
    quiescence,
    refcount,
    requests,
    slot_table,
    tree,
)
from kvwatch.gate.detectors.stats import MIN_POINTS as MIN_JUDGED_TURNS
from kvwatch.gate.detectors.verdict import FAIL, PASS, SKIPPED, Evidence, Verdict
from kvwatch.gate.run_record import HeapSample, Replay, RunRecord, Turn

DETECTORS: Mapping[str, Callable[[RunRecord], Verdict]] = {
    m.ID: m.detect
    for m in (
        allocator,
        refcount,
        tree,
        heap,
        gauge_trend,
        slot_table,
        equivalence,
        requests,
        quiescence,
    )
}
IDS = tuple(DETECTORS)


def run_detectors(run: RunRecord, only: tuple[str, ...] = IDS) -> dict[str, Verdict]:
    return {name: DETECTORS[name](run) for name in only}


__all__ = [
    "DETECTORS",
    "FAIL",
    "IDS",
    "MIN_JUDGED_TURNS",
    "PASS",
    "SKIPPED",
    "Evidence",
    "HeapSample",
    "Replay",
    "RunRecord",
    "Turn",
    "Verdict",
    "run_detectors",
]
