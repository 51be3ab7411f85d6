"""A pytest plugin (entry point ``pytest11: kvwatch``): gate your own tests on leaks.

    def test_agent_turns_do_not_leak(leak_gate):
        engine = Engine(EngineConfig())
        with leak_gate(engine.probe) as gate:
            for turn in range(8):
                run_one_turn(engine)
                gate.turn()                       # probe at the barrier

``probe`` is any callable returning a ``ProbeReport`` or the probe JSON of
``GET /debug/probe`` (a dict). At the end of the block the detectors judge the turns;
a failing one fails the test with its evidence. With ``heap=True`` the gate
also samples tracemalloc and needs ``context_tokens`` at every turn.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from kvwatch.contracts import ProbeReport
from kvwatch.gate.detectors import Signal, Verdict, detector_set, for_signals
from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
from kvwatch.harness.sources import CallableSource

# what an engine's own probe carries (no server registries, no replays, no gauges)
DEFAULT_DETECTORS = for_signals({Signal.PROBES, Signal.SLOTS})
HEAP_FRAMES = 8


class LeakGate:
    """A ``TurnRecorder`` over ``probe``, judged when the block ends."""

    def __init__(
        self,
        probe: Callable[[], Any],
        *,
        detectors: Sequence[str] = DEFAULT_DETECTORS,
        warmup: int = 2,
        heap: bool = False,
        heap_scope: str | None = None,
    ) -> None:
        self.detectors = tuple(detectors)
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
        run = self.recorder.record()._replace(drained=drained)
        return detector_set(only=self.detectors).judge(run)


def format_failures(verdicts: dict[str, Verdict]) -> str:
    lines = []
    for name, v in verdicts.items():
        if v.failed:
            lines.append(f"kvwatch detector {name!r} failed at turn {v.first_turn}:")
            for e in v.evidence:
                where = f"[{e.group}] " if e.group else ""
                pages = f" pages {list(e.pages)[:8]}" if e.pages else ""
                lines.append(f"  {where}{e.detail}{pages}")
                lines += [f"    {frame}" for frame in e.traceback[-4:]]
    return "\n".join(lines)


@contextmanager
def leak_gate(probe: Callable[[], Any], **options: Any) -> Iterator[LeakGate]:
    started = options.get("heap") and not tracemalloc.is_tracing()
    try:
        gate = LeakGate(probe, **options)
        yield gate
    finally:
        if started:  # before judging: tracing every allocation of the detectors' imports is slow
            tracemalloc.stop()
    failures = format_failures(gate.verdicts())
    if failures:
        pytest.fail(failures, pytrace=False)


@pytest.fixture(name="leak_gate")
def leak_gate_fixture() -> Callable[..., Any]:
    """``with leak_gate(probe) as gate: ... gate.turn()``: fails the test on a leak."""
    return leak_gate
