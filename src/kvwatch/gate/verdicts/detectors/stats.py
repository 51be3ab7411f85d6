"""Trend tests for turn series: Theil–Sen slope and Kendall's tau, after a warm-up.

Like CPython's ``regrtest -R``, the first turns are discarded: caches fill
and pools settle there. A series is *rising* when Kendall's tau says the
order is increasing (one-sided), the Theil–Sen confidence interval of the
slope lies above zero, and the slope is large against the series' level (so a
byte or two per turn of interpreter noise is not a leak).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

ALPHA = 0.05
MIN_POINTS = 4
MIN_RELATIVE_SLOPE = 0.02  # per turn, against the median level


class Trend(NamedTuple):
    slope: float
    low: float
    high: float
    tau: float
    p_value: float
    points: int

    @property
    def describe(self) -> str:
        return (
            f"slope {self.slope:.4g}/turn (90% CI {self.low:.4g}..{self.high:.4g}), "
            f"Kendall tau {self.tau:.2f}, p={self.p_value:.3f} over {self.points} turns"
        )


def trend(values: Sequence[float], at: Sequence[float] | None = None) -> Trend:
    """Theil–Sen slope (90 % interval) and one-sided Kendall tau of ``values``
    against ``at`` (default: 0, 1, 2, ...: per turn)."""
    y = np.asarray(values, dtype=float)
    x = np.arange(len(y), dtype=float) if at is None else np.asarray(at, dtype=float)
    if len(y) < 2 or np.all(y == y[0]) or np.ptp(x) == 0:
        return Trend(slope=0.0, low=0.0, high=0.0, tau=0.0, p_value=1.0, points=len(y))
    from scipy import stats  # here, not at import: the CLI checks its flags first (1.5 s)

    slope, _, low, high = stats.theilslopes(y, x, alpha=0.90)
    tau, p = stats.kendalltau(x, y, alternative="greater")
    return Trend(
        slope=float(slope),
        low=float(low),
        high=float(high),
        tau=float(tau),
        p_value=float(p),
        points=len(y),
    )


def is_rising(
    t: Trend, level: float, min_relative_slope: float = MIN_RELATIVE_SLOPE, min_slope: float = 0.0
) -> bool:
    return (
        t.points >= MIN_POINTS
        and t.p_value < ALPHA
        and t.low > 0
        and t.slope > min_relative_slope * max(abs(level), 1e-9)
        and t.slope >= min_slope
    )


def first_rise(
    turns: Sequence[int],
    values: Sequence[float],
    warmup: int,
    min_relative_slope: float = MIN_RELATIVE_SLOPE,
    min_slope: float = 0.0,
) -> tuple[int, Trend] | None:
    """The first turn at which the series since the warm-up is rising, and its trend."""
    start = min(warmup, max(0, len(values) - MIN_POINTS))
    for end in range(start + MIN_POINTS, len(values) + 1):
        window = values[start:end]
        t = trend(window)
        if is_rising(t, float(np.median(window)), min_relative_slope, min_slope):
            return turns[end - 1], t
    return None
