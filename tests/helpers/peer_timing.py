"""Timing for the peer benchmark: a per-op clock, and the spread of a ratio over runs.

``Clock.time(op, fn, *args)`` runs ``fn`` and adds its thread CPU time
(``time.thread_time``: another process on the machine does not count) to
``spent[op]``; with a ``cProfile.Profile`` it runs ``fn`` under it, so a
profile holds the timed calls only. ``Spread.of(values)`` is the median,
min and max of one figure over several runs: a published ratio is a median,
and its range says how far a rerun may land.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

OPS = ("match", "insert", "evict")


class Clock:
    """Thread CPU time per op, summed over the calls it timed."""

    def __init__(self, profile: Any = None) -> None:
        self.spent = dict.fromkeys(OPS, 0.0)
        self.profile = profile  # a cProfile.Profile, or None

    def time(self, op: str, fn: Callable, *args: Any) -> Any:
        run = fn if self.profile is None else (lambda *a: self.profile.runcall(fn, *a))
        start = time.thread_time()
        out = run(*args)
        self.spent[op] += time.thread_time() - start
        return out


class Spread(NamedTuple):
    """A figure over several runs: median, min, max (min <= median <= max)."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("a spread of no values")
        return cls(statistics.median(values), min(values), max(values))

    def rounded(self, digits: int = 3) -> list[float]:
        return [round(v, digits) for v in self]
