"""What the engine thread spent its CPU on: steps, the per-step watch, and calls.

The worker adds to it as it goes (thread CPU time, ``time.thread_time``, so a
busy machine does not inflate it); ``GET /debug/timing`` reads it, and the
gate takes the difference over a run (the gate's time profile, BENCHMARKS.md)::

    steps        engine steps taken
    step_s       in Engine.step and handing its outputs to the streams
    watch_s      in the probe after each step while watching (/debug/watch)
    calls_s      in calls run between steps: probes, flushes, coverage, ...
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WorkTime:
    """Running totals, written by the engine thread alone."""

    def __init__(self) -> None:
        self.steps = 0
        self.step_s = 0.0
        self.watch_s = 0.0
        self.calls_s = 0.0

    def stepped(self, started: float) -> None:
        """One engine step done, begun at ``started`` (``time.thread_time()``)."""
        self.steps += 1
        self.step_s += time.thread_time() - started

    def timed(self, field: str, fn: Callable[[], T]) -> T:
        """``fn()``, its thread CPU time added to ``field``."""
        start = time.thread_time()
        try:
            return fn()
        finally:
            setattr(self, field, getattr(self, field) + time.thread_time() - start)

    def to_json(self) -> dict:
        return {
            "steps": self.steps,
            "step_s": round(self.step_s, 4),
            "watch_s": round(self.watch_s, 4),
            "calls_s": round(self.calls_s, 4),
        }
