"""Leak detectors: pure functions from a recorded run to a verdict.

Ids are stable (summary.json and CI use them). Each module holds one
detector: ``ID``, ``NEEDS`` (the ``Signal``s a run record must carry for it
to judge anything) and ``detect(run: RunRecord) -> Verdict``.

Which detectors judge a target is decided here and nowhere else:
``for_signals(target.signals)`` is every detector whose needs the target's
records carry. ``run_detectors`` runs them one by one; a detector that
raises fails alone, with verdict ``error`` and the exception as evidence,
and the others still judge the run.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Collection, Mapping
from typing import NamedTuple

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
from kvwatch.gate.detectors.verdict import ERROR, FAIL, PASS, SKIPPED, Evidence, Verdict
from kvwatch.gate.run_record import HeapSample, Replay, RunRecord, Signal, Turn


class Detector(NamedTuple):
    id: str
    needs: frozenset[Signal]
    detect: Callable[[RunRecord], Verdict]


REGISTRY: Mapping[str, Detector] = {
    m.ID: Detector(id=m.ID, needs=m.NEEDS, detect=m.detect)
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
DETECTORS: Mapping[str, Callable[[RunRecord], Verdict]] = {
    name: d.detect for name, d in REGISTRY.items()
}
IDS = tuple(REGISTRY)


def for_signals(signals: Collection[Signal]) -> tuple[str, ...]:
    """The ids of every detector whose needs ``signals`` cover, in ``IDS`` order."""
    have = frozenset(signals)
    return tuple(name for name, d in REGISTRY.items() if d.needs <= have)


def run_detectors(run: RunRecord, only: Collection[str] = IDS) -> dict[str, Verdict]:
    """Each detector of ``only`` over ``run``, in ``IDS`` order; one that raises
    gets an ``error`` verdict and the rest still run."""
    return {name: judge_one(REGISTRY[name], run) for name in IDS if name in only}


def judge_one(detector: Detector, run: RunRecord) -> Verdict:
    try:
        return detector.detect(run)
    except Exception as exc:  # a crashing checker fails alone
        lines = traceback.format_exception(exc)
        return Verdict(
            detector=detector.id,
            verdict=ERROR,
            first_turn=None,
            evidence=(
                Evidence(
                    group=None,
                    pages=(),
                    detail=f"the detector raised {type(exc).__name__}: {exc}",
                    traceback=tuple(line.rstrip("\n") for line in lines[-12:]),
                ),
            ),
        )


__all__ = [
    "DETECTORS",
    "ERROR",
    "FAIL",
    "IDS",
    "MIN_JUDGED_TURNS",
    "PASS",
    "REGISTRY",
    "SKIPPED",
    "Detector",
    "Evidence",
    "HeapSample",
    "Replay",
    "RunRecord",
    "Signal",
    "Turn",
    "Verdict",
    "for_signals",
    "judge_one",
    "run_detectors",
]
