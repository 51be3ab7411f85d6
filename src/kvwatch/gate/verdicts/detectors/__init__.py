"""Leak detectors: pure functions from a recorded run to a verdict.

Ids are stable (summary.json and CI use them). Each module holds one
detector: ``ID``, ``NEEDS`` (the ``Signal``s a run record must carry for it
to judge anything) and ``detect(run: RunRecord) -> Verdict``.

Which detectors judge a run is decided here and nowhere else:
``detector_set(signals)`` composes every detector whose needs the run's
record carries (a gate's target, a soak, a pytest test), narrowed to the ids
asked for. The set judges a run detector by detector; one that raises fails
alone, with verdict ``error`` and the exception as evidence, and the others
still judge the run.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Collection, Mapping
from typing import NamedTuple

from kvwatch.gate.verdicts.detectors import (
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
from kvwatch.gate.verdicts.detectors.stats import MIN_POINTS as MIN_JUDGED_TURNS
from kvwatch.gate.verdicts.detectors.verdict import ERROR, FAIL, PASS, SKIPPED, Evidence, Verdict
from kvwatch.harness.run_record import HeapSample, Replay, RunRecord, Signal, Turn


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


class DetectorSet(NamedTuple):
    """Detectors composed into one checker, in ``IDS`` order."""

    detectors: tuple[Detector, ...]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.detectors)

    def judge(self, run: RunRecord) -> dict[str, Verdict]:
        """Each detector's verdict on ``run``; one that raises gets an ``error``
        verdict and the rest still judge."""
        return {d.id: judge_one(d, run) for d in self.detectors}


def detector_set(
    signals: Collection[Signal] = frozenset(Signal), only: Collection[str] | None = None
) -> DetectorSet:
    """Every detector whose needs ``signals`` cover, narrowed to the ids in ``only``
    when given (ValueError for an id no detector has, or one whose needs the
    signals do not cover: it could judge nothing)."""
    have = frozenset(signals)
    if only is not None:
        for name in only:
            if name not in REGISTRY:
                raise ValueError(f"unknown detector {name!r}; detectors are {', '.join(IDS)}")
            if not REGISTRY[name].needs <= have:
                missing = ", ".join(sorted(s.value for s in REGISTRY[name].needs - have))
                raise ValueError(f"detector {name!r} needs {missing}, which this run lacks")
    return DetectorSet(
        tuple(d for d in REGISTRY.values() if d.needs <= have and (only is None or d.id in only))
    )


NONE = DetectorSet(())  # a run that broke before it recorded anything to judge


def for_signals(signals: Collection[Signal]) -> tuple[str, ...]:
    """The ids of every detector whose needs ``signals`` cover, in ``IDS`` order."""
    return detector_set(signals).ids


def skipped_for(signals: Collection[Signal]) -> dict[str, tuple[str, ...]]:
    """Each detector ``signals`` do not cover, and the signals it lacks (what a target
    with those signals never judges, and why), in ``IDS`` order."""
    have = frozenset(signals)
    return {
        d.id: tuple(sorted(s.value for s in d.needs - have))
        for d in REGISTRY.values()
        if not d.needs <= have
    }


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
    "NONE",
    "PASS",
    "REGISTRY",
    "SKIPPED",
    "Detector",
    "DetectorSet",
    "Evidence",
    "HeapSample",
    "Replay",
    "RunRecord",
    "Signal",
    "Turn",
    "Verdict",
    "detector_set",
    "for_signals",
    "judge_one",
]
