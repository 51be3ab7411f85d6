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
from kvwatch.instrumentation.detectors import HeapSample, RunRecord, Turn, Verdict, run_detectors

DEFAULT_DETECTORS = ("allocator", "refcount", "tree", "slot-table")


class LeakGate:
    def __init__(
        self,
        probe: Callable[[], Any],
        *,
        detectors: Sequence[str] = DEFAULT_DETECTORS,
        warmup: int = 2,
        heap: bool = False,
    ) -> None:
        self.probe, self.detectors, self.warmup, self.heap = probe, tuple(detectors), warmup, heap
        if heap and "heap" not in self.detectors:
            self.detectors += ("heap",)
        self.turns: list[Turn] = []
        self.baseline = self._probe()

    def _probe(self) -> ProbeReport:
        report = self.probe()
        return report if isinstance(report, ProbeReport) else ProbeReport.from_json(report)

    def turn(self, *, conversations: int = 0, context_tokens: int = 0) -> None:
        """Record a barrier: call it once per turn, with the engine idle."""
        sample = None
        if self.heap:
            snap = tracemalloc.take_snapshot()
            sample = HeapSample(sum(s.size for s in snap.statistics("filename")))
        probe = self._probe()
        self.turns.append(Turn(len(self.turns), (probe,), conversations, context_tokens, sample))

    def verdicts(self, drained: ProbeReport | None = None) -> dict[str, Verdict]:
        run = RunRecord(tuple(self.turns), self.warmup, self.baseline, drained)
        return run_detectors(run, self.detectors)


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
    if started:
        tracemalloc.start(8)
    try:
        gate = LeakGate(probe, **options)
        yield gate
        verdicts = gate.verdicts()
    finally:
        if started:
            tracemalloc.stop()
    failures = format_failures(verdicts)
    if failures:
        pytest.fail(failures, pytrace=False)


@pytest.fixture(name="leak_gate")
def leak_gate_fixture() -> Callable[..., Any]:
    """``with leak_gate(probe) as gate: ... gate.turn()``: fails the test on a leak."""
    return leak_gate
