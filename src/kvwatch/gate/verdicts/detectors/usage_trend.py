"""Bounded usage over time: the allocator's rule for a soak.

*Pinned* pages are the probe's ``bounds[group].pinned``: pages that neither
eviction nor pruning can take back. Used pages (capacity - free) are no
measure under load: the prefix cache fills every pool on purpose. A group is
bounded when both hold:

1. headroom: pinned pages stay below capacity at every probe, so the pool
   never ran out of pages it could take back;
2. no growth: *not* both of

   a. the trend test (``stats.trend``: Theil–Sen slope and one-sided
      Kendall tau, against time) says pinned pages rise: p < ``ALPHA``, the
      slope's interval above zero, and the fitted rise over the judged span
      above the tolerance;
   b. the largest value in the last third of the judged probes exceeds the
      largest in the first third by more than the tolerance;

   with tolerance = max(``MIN_TOLERANCE_PAGES``, ``TOLERANCE_FRACTION`` x
   capacity).

A clean engine's pinned pages swing with what is in flight, so a short
stretch can look like a trend, or one window's peak sit above another's; a
leak does both at once, for the whole run. And pinned pages rise through an
episode (contexts grow turn by turn) and fall when it ends, so growth is
judged only across whole episodes (``judged_from``); a soak too short for
that judges headroom only, and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from kvwatch.gate.verdicts.detectors.stats import trend

ALPHA = 0.01  # one-sided: many probes, so a stricter level than per-turn series
MIN_TOLERANCE_PAGES = 4
TOLERANCE_FRACTION = 0.05  # of the group's capacity
MIN_TREND_POINTS = 8
MIN_JUDGED_EPISODES = 2  # ends of each user's episodes after the first, in the judged span


class UsageTrend(NamedTuple):
    group: str
    capacity: int
    pinned_min: int
    pinned_max: int
    points: int  # probes in the judged span
    slope_per_min: float  # Theil–Sen slope of pinned pages, per minute
    p_value: float  # one-sided Kendall: pinned pages rise with time
    rise: float  # slope x the judged span: pages the fit gains over it
    first_window_max: int
    last_window_max: int
    tolerance: float
    bounded: bool
    why: str

    def as_dict(self) -> dict:
        out = self._asdict()
        for key in ("slope_per_min", "p_value", "rise", "tolerance"):
            out[key] = round(float(out[key]), 4)
        return out


def tolerance(capacity: int) -> float:
    return max(MIN_TOLERANCE_PAGES, TOLERANCE_FRACTION * capacity)


def judged_from(
    warmup: float, users: int, episode_ends: Sequence[tuple[int, float]], last: float
) -> tuple[float, str | None]:
    """Where a soak's usage trend starts, and why it cannot be judged (None: it can).

    The trend starts after the warm-up and once every one of ``users`` has
    ended its first episode (``episode_ends``: user and time, in seconds of
    the soak). Up to ``last``, the time of the last probe, each user must end
    ``MIN_JUDGED_EPISODES`` more episodes. A slow machine runs fewer episodes
    in the same time: then there is no trend to judge, which is said, rather
    than a partial episode's rise being taken for a leak::

        t:  0 ..warmup.. | u0 ends ep.1 .. u1 ends ep.1 | ..judged: >= 2 more ends each.. | last
    """
    ends: dict[int, list[float]] = {}
    for user, t in sorted(episode_ends, key=lambda e: e[1]):
        ends.setdefault(user, []).append(t)
    if users <= 0 or len(ends) < users:
        return warmup, f"{len(ends)} of {users} users ended an episode: too short for a trend"
    start = max(warmup, *(times[0] for times in ends.values()))
    fewest = min(sum(start < t <= last for t in times) for times in ends.values())
    if fewest < MIN_JUDGED_EPISODES:
        return start, (
            f"{fewest} whole episodes of the slowest user after {start:.0f} s "
            f"(want {MIN_JUDGED_EPISODES}): too short for a trend"
        )
    return start, None


def usage_trend(
    group: str,
    capacity: int,
    times: Sequence[float],
    pinned: Sequence[int],
    warmup: float,
    users: int,
    episode_ends: Sequence[tuple[int, float]],
) -> UsageTrend:
    """Whether a group's pinned pages stay bounded over a soak (see the module)."""
    t = np.asarray(times, dtype=float)
    y = np.asarray(pinned, dtype=float)
    tol = tolerance(capacity)
    start, too_short = judged_from(warmup, users, episode_ends, float(t[-1]) if len(t) else 0.0)
    judged = t >= start
    tj, yj = t[judged], y[judged]
    lo, hi = (int(y.min()), int(y.max())) if len(y) else (0, 0)
    head = dict(group=group, capacity=capacity, pinned_min=lo, pinned_max=hi, points=len(yj))
    if too_short is None and len(yj) < MIN_TREND_POINTS:
        too_short = f"{len(yj)} probes after the warm-up: too few for a trend"
    if too_short is not None:
        why = f"{too_short}; headroom only ({lo}..{hi} of {capacity})"
        flat = dict(slope_per_min=0.0, p_value=1.0, rise=0.0)
        windows = dict(first_window_max=hi, last_window_max=hi)
        return UsageTrend(**head, **flat, **windows, tolerance=tol, bounded=hi < capacity, why=why)
    fit = trend(yj, tj)
    rise = fit.slope * float(tj[-1] - tj[0])
    third = max(1, len(yj) // 3)
    first, last = int(yj[:third].max()), int(yj[-third:].max())
    rising = fit.p_value < ALPHA and fit.low > 0 and rise > tol
    climbing = last > first + tol
    if hi >= capacity:
        bounded, why = False, f"pinned pages reached the capacity ({hi} of {capacity})"
    elif rising and climbing:
        bounded = False
        why = (
            f"pinned pages grow: {fit.slope * 60:+.2f}/min (p={fit.p_value:.2g}), "
            f"+{rise:.0f} over the run; last third peaks at {last}, first third at {first} "
            f"(tolerance {tol:.0f})"
        )
    else:
        bounded = True
        why = f"{lo}..{hi} of {capacity}, {fit.slope * 60:+.2f}/min (p={fit.p_value:.2g})"
    fitted = dict(slope_per_min=fit.slope * 60, p_value=fit.p_value, rise=rise)
    windows = dict(first_window_max=first, last_window_max=last)
    return UsageTrend(**head, **fitted, **windows, tolerance=tol, bounded=bounded, why=why)
