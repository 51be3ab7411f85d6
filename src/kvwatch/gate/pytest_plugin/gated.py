"""A marked test's gate: the baseline before its body, a barrier per turn, the
drained probe after it, and the verdicts of the composed detector set.

The recorder is the one every kvwatch run uses (``TurnRecorder`` over a
``CallableSource``); the detectors come from ``detector_set`` and nowhere
else. ``max_pages`` is judged here as one more verdict, ``max_pages``: the
pages a group holds (in use: capacity less free, cached pages included) at
every barrier and after the test, against the most the marker allows.
"""

from __future__ import annotations

import tracemalloc
from typing import TYPE_CHECKING, NamedTuple

from kvwatch.gate.pytest_plugin.options import MARKER, MarkerError, MarkerOptions, ProbeTarget

if TYPE_CHECKING:
    from kvwatch.contracts import ProbeReport
    from kvwatch.gate.verdicts.detectors import RunRecord, Verdict

BOUND_ID = "max_pages"
HEAP_FRAMES = 8  # frames per allocation when the gate starts tracemalloc itself


class GateOutcome(NamedTuple):
    """What a marked test's gate found. ``verdicts``: the detectors' in registry
    order, then ``max_pages`` when the marker bounds pages. ``error``: the gate
    could not judge (a probe raised); it fails the test like a finding."""

    turns: int  # barriers recorded
    warmup: int
    verdicts: tuple[Verdict, ...]
    after: str  # what was done before the final probe, in words
    error: str = ""

    @property
    def failures(self) -> tuple[Verdict, ...]:
        """The verdicts that fail the test: failed, or the detector raised."""
        return tuple(v for v in self.verdicts if v.failed or v.errored)

    @property
    def failed(self) -> bool:
        return bool(self.error or self.failures)


def broken(error: str, turns: int, warmup: int) -> GateOutcome:
    """The outcome of a gate that could not judge the test."""
    return GateOutcome(turns=turns, warmup=warmup, verdicts=(), after="", error=error)


class MarkedGate:
    """One marked test's recorder. Invariants: the baseline probe is taken when the
    gate is built, before the test body; turns are numbered from 0 in the order
    the barriers are called; ``end`` runs once, and stops tracemalloc if (and only
    if) this gate started it, before the detectors judge."""

    def __init__(self, options: MarkerOptions, target: ProbeTarget) -> None:
        from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
        from kvwatch.harness.sources import CallableSource

        self.options, self.target = options, target
        self._tracing = options.heap and not tracemalloc.is_tracing()
        frames = tracemalloc.get_traceback_limit() if tracemalloc.is_tracing() else HEAP_FRAMES
        source = CallableSource(
            target.probe, flush=target.flush, heap_scope=options.heap_scope, heap_frames=frames
        )
        recorder_options = RecorderOptions(
            warmup=options.warmup,
            heap=options.heap,
            drain_timeout=options.drain_timeout,
            replays=False,
        )
        self.recorder = TurnRecorder(source, recorder_options)
        try:
            self.recorder.start()
            self._check_groups(self.recorder.baseline)
        except BaseException:
            self._stop_tracing()
            raise

    def turn(self, *, conversations: int = 0, context_tokens: int = 0) -> None:
        """A barrier: the engine drained to idle (or ``drain_timeout`` passed), probed."""
        report = {"conversations": conversations, "context_tokens": context_tokens}
        self.recorder.barrier(len(self.recorder.turns), [report])

    def end(self) -> GateOutcome:
        """The final probe (drained, flushed where the target can flush) and the verdicts."""
        from kvwatch.gate.verdicts.detectors import detector_set

        try:
            self.recorder.finish()
        finally:
            self._stop_tracing()
        run = self.recorder.record()
        judged = detector_set(self.options.signals, only=self.options.detectors).judge(run)
        verdicts = tuple(judged.values())
        if self.options.max_pages:
            verdicts += (bound_verdict(run, dict(self.options.max_pages)),)
        return GateOutcome(
            turns=len(run.turns),
            warmup=self.options.warmup,
            verdicts=verdicts,
            after=self._after(run),
            error="",
        )

    def _after(self, run: RunRecord) -> str:
        flushed = (
            "cache flushed"
            if self.target.flush is not None
            else "not flushed (the probe fixture has no flush_cache(): cached pages count as held)"
        )
        note = f"; {run.error}" if run.error else ""
        idle = "not idle in time, probed as it was" if self.recorder.stuck else "drained"
        return f"{idle}, {flushed}{note}"

    def _check_groups(self, baseline: ProbeReport | None) -> None:
        groups = baseline.groups if baseline is not None else {}
        unknown = [g for g, _ in self.options.max_pages if g not in groups]
        if unknown:
            raise MarkerError(
                f"@pytest.mark.{MARKER}(max_pages=...): no group {', '.join(unknown)} in the "
                f"probe; its groups are {', '.join(groups)}"
            )

    def _stop_tracing(self) -> None:
        if self._tracing and tracemalloc.is_tracing():
            tracemalloc.stop()  # before judging: tracing the detectors' imports is slow
        self._tracing = False


def bound_verdict(run: RunRecord, max_pages: dict[str, int]) -> Verdict:
    """``max_pages`` as a verdict: fail at the first probe (barrier, or the one after
    the test) where a group holds more pages than allowed; the evidence names each
    group's first breach and its peak."""
    from kvwatch.gate.verdicts.detectors.verdict import fail, fail_after_drain, passed, skipped

    probes = [(t.turn, p) for t in run.turns for p in t.probes]
    probes += [(None, run.drained)] if run.drained is not None else []
    if not probes:
        return skipped(BOUND_ID, "no probe was taken, so no bound was judged")
    peaks = {g: max(p.groups[g].used for _, p in probes) for g in max_pages}
    breaches = [
        (turn, group, probe)
        for turn, probe in probes
        for group, limit in max_pages.items()
        if probe.groups[group].used > limit
    ]
    if not breaches:
        held = ", ".join(f"{g} held at most {peaks[g]} of {n}" for g, n in max_pages.items())
        return passed(BOUND_ID, f"{held} pages in {len(probes)} probes")
    evidence = _breach_evidence(breaches, max_pages, peaks)
    turn = breaches[0][0]
    return (
        fail(BOUND_ID, turn, evidence)
        if turn is not None
        else fail_after_drain(BOUND_ID, run, evidence)
    )


def _breach_evidence(breaches: list, max_pages: dict[str, int], peaks: dict[str, int]) -> list:
    """One line per group over its bound, at its first breach: what it held, the
    bound, its peak, and when, where that is not the verdict's first breach."""
    from kvwatch.gate.verdicts.detectors.verdict import Evidence

    evidence, seen, first = [], set(), breaches[0][0]
    for turn, group, probe in breaches:
        if group in seen:
            continue
        seen.add(group)
        g = probe.groups[group]
        when = "" if turn == first else f", first at {_when(turn)}"
        detail = (
            f"{g.used} pages held ({g.evictable} of them evictable), "
            f"max_pages allows {max_pages[group]}; peak {peaks[group]}{when}"
        )
        evidence.append(Evidence(group=group, pages=(), detail=detail))
    return evidence


def _when(turn: int | None) -> str:
    return f"turn {turn}" if turn is not None else "the end of the test"
