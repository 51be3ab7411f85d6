"""The ``leak_gate`` fixture's gate: an explicit block of barriers, judged when it ends.

    with leak_gate(engine.probe, warmup=1) as gate:
        for turn in range(8):
            run_one_turn(engine)
            gate.turn()

The block records no final probe: its turns are judged, not a drain. A
failing detector fails the test with its evidence (``format_failures``).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

from kvwatch.gate.pytest_plugin.text import format_failures

if TYPE_CHECKING:
    from kvwatch.contracts import ProbeReport
    from kvwatch.gate.verdicts.detectors import Verdict

HEAP_FRAMES = 8


class LeakGate:
    """A ``TurnRecorder`` over ``probe``, judged when the block ends."""

    def __init__(
        self,
        probe: Callable[[], Any],
        *,
        detectors: Sequence[str] | None = None,
        warmup: int = 2,
        heap: bool = False,
        heap_scope: str | None = None,
    ) -> None:
        from kvwatch.gate.verdicts.detectors import Signal, for_signals
        from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
        from kvwatch.harness.sources import CallableSource

        # what an engine's own probe carries (no server registries, no replays, no gauges)
        default = for_signals({Signal.PROBES, Signal.SLOTS})
        self.detectors = tuple(default if detectors is None else detectors)
        if heap and "heap" not in self.detectors:
            self.detectors += ("heap",)
        frames = tracemalloc.get_traceback_limit() if tracemalloc.is_tracing() else HEAP_FRAMES
        self.source = CallableSource(probe, heap_scope=heap_scope, heap_frames=frames)
        self.recorder = TurnRecorder(self.source, RecorderOptions(warmup=warmup, heap=heap))
        self.recorder.start()

    def turn(self, *, conversations: int = 0, context_tokens: int = 0) -> None:
        """Record a barrier: call it once per turn, with the engine idle."""
        report = {"conversations": conversations, "context_tokens": context_tokens}
        self.recorder.barrier(len(self.recorder.turns), [report], drain=False)

    def verdicts(self, drained: ProbeReport | None = None) -> dict[str, Verdict]:
        from kvwatch.gate.verdicts.detectors import detector_set

        run = self.recorder.record()._replace(drained=drained)
        return detector_set(only=self.detectors).judge(run)


@contextmanager
def leak_gate(probe: Callable[[], Any], **options: Any) -> Iterator[LeakGate]:
    started = options.get("heap") and not tracemalloc.is_tracing()
    try:
        gate = LeakGate(probe, **options)
        yield gate
    finally:
        if started:  # before judging: tracing every allocation of the detectors' imports is slow
            tracemalloc.stop()
    failures = format_failures(gate.verdicts().values())
    if failures:
        pytest.fail(failures, pytrace=False)
