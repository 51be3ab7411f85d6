"""The soak's verdict: four checks over what a soak recorded.

==================  ===================================================================
check               passes when
==================  ===================================================================
no-5xx              no request got a 5xx answer (the server answers 5xx only for a bug)
probe-findings      no probe, busy or drained, has an audit finding (orphan, double
                    ownership, ref mismatch, tree, slot table) or pinned pages above
                    the bound its live holders justify
usage-bounded       every pool group's pinned pages stay bounded (``usage_trend``)
drain-to-baseline   once the load stopped, sessions closed and the cache was flushed,
                    every group uses exactly the pages it used before the load, and no
                    request or session is live
==================  ===================================================================

*Pinned* pages are the probe's ``bounds[group].pinned``: pages that neither
eviction nor pruning can take back. Used pages (capacity - free) are no
measure under load: the prefix cache fills every pool on purpose.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from scipy import stats

from kvwatch.contracts import ProbeReport

PASS, FAIL = "pass", "fail"
CHECKS = ("no-5xx", "probe-findings", "usage-bounded", "drain-to-baseline")
ALPHA = 0.01  # one-sided significance of the regression slope
MIN_TOLERANCE_PAGES = 4
TOLERANCE_FRACTION = 0.05  # of the group's capacity
MIN_TREND_POINTS = 8
# Pinned pages rise through an episode (contexts grow turn by turn) and fall
# when it ends, so growth is judged only across whole episodes: after every
# user ended its first one, and over at least this many more ends of each.
MIN_JUDGED_EPISODES = 2


class Hit(NamedTuple):
    """An audit finding, or a group above the bound its live holders justify."""

    kind: str  # a FindingKind, or "bound"
    group: str | None
    detail: str


class Sample(NamedTuple):
    """One probe taken while the load ran, reduced to what the checks read."""

    t: float  # seconds since the load started
    live_requests: int
    live_sessions: int
    capacity: dict[str, int]
    used: dict[str, int]  # capacity - free
    pinned: dict[str, int]  # what nothing can take back
    by_owner: dict[str, dict[str, int]]
    findings: tuple[Hit, ...]  # audit findings and exceeded bounds


def sample(probe: ProbeReport, t: float) -> Sample:
    groups = probe.groups
    return Sample(
        round(t, 3),
        probe.live_requests,
        probe.live_sessions,
        {g: v.capacity for g, v in groups.items()},
        {g: v.used for g, v in groups.items()},
        {g: probe.bounds[g].pinned if g in probe.bounds else v.used for g, v in groups.items()},
        {g: dict(v.by_owner) for g, v in groups.items()},
        findings(probe),
    )


def findings(probe: ProbeReport) -> tuple[Hit, ...]:
    """The probe's audit findings, and one per group above its bound."""
    audit = [Hit(str(f.kind), f.group, f.detail) for f in probe.findings]
    over = [
        Hit(
            "bound",
            b.group,
            f"{b.pinned} pinned pages, live holders ({b.holders}) justify {b.limit}",
        )
        for b in probe.exceeded()
    ]
    return (*audit, *over)


class UsageTrend(NamedTuple):
    group: str
    capacity: int
    pinned_min: int
    pinned_max: int
    points: int  # samples after the warm-up
    slope_per_min: float  # least-squares slope of pinned pages, per minute
    p_value: float  # one-sided: the slope is above zero
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


def judged_from(
    warmup: float, users: int, episode_ends: Sequence[tuple[int, float]], last: float
) -> tuple[float, str | None]:
    """Where a soak's usage trend starts, and why it cannot be judged (None: it can).

    The trend starts after the warm-up and once every one of ``users`` has
    ended its first episode (``episode_ends``: user and time, in seconds of
    the soak). Up to ``last``, the time of the last sample, each user must
    end ``MIN_JUDGED_EPISODES`` more episodes. A slow machine runs fewer
    episodes in the same time: then there is no trend to judge, which is
    said, rather than a partial episode's rise being taken for a leak::

        t:     0 ..warmup.. | u0 ends ep.1 .. u1 ends ep.1 | ..judged: >= 2 more ends each.. | last
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
    """Whether a group's pinned pages stay bounded over a soak.

    Samples before ``judged_from`` are left out of the trend (pools fill,
    sessions open, the first episode runs). The group is bounded when both
    hold:

    1. headroom: pinned pages stay below capacity at every sample, so the pool
       never ran out of pages it could take back;
    2. no growth: *not* both of
       a. the least-squares slope of pinned pages over time is positive and
          significant (``scipy.stats.linregress``, one-sided p < ``ALPHA``)
          and the fit rises by more than the tolerance over the judged span;
       b. the largest value in the last third of the judged samples exceeds
          the largest in the first third by more than the tolerance;
       with tolerance = max(``MIN_TOLERANCE_PAGES``, ``TOLERANCE_FRACTION`` x
       capacity).

    A clean engine's pinned pages swing with what is in flight, so a short
    stretch can look like a trend, or one window's peak sit above another's;
    a leak does both at once, for the whole run. When the judged span holds
    too few whole episodes or fewer than ``MIN_TREND_POINTS`` samples, only
    the headroom is judged, and ``why`` says so.
    """
    t = np.asarray(times, dtype=float)
    y = np.asarray(pinned, dtype=float)
    tolerance = max(MIN_TOLERANCE_PAGES, TOLERANCE_FRACTION * capacity)
    start, too_short = judged_from(warmup, users, episode_ends, float(t[-1]) if len(t) else 0.0)
    judged = t >= start
    tj, yj = t[judged], y[judged]
    lo, hi = (int(y.min()), int(y.max())) if len(y) else (0, 0)
    head = (group, capacity, lo, hi, len(yj))
    if too_short is None and len(yj) < MIN_TREND_POINTS:
        too_short = f"{len(yj)} samples after the warm-up: too few for a trend"
    if too_short is not None:
        bounded = hi < capacity
        why = f"{too_short}; headroom only ({lo}..{hi} of {capacity})"
        return UsageTrend(*head, 0.0, 1.0, 0.0, hi, hi, tolerance, bounded, why)
    if np.ptp(yj) == 0 or np.ptp(tj) == 0:
        slope, p = 0.0, 1.0
    else:
        fit = stats.linregress(tj, yj, alternative="greater")
        slope, p = float(fit.slope), float(fit.pvalue)
    rise = slope * float(tj[-1] - tj[0])
    third = max(1, len(yj) // 3)
    first, last = int(yj[:third].max()), int(yj[-third:].max())
    trending = p < ALPHA and rise > tolerance
    climbing = last > first + tolerance
    if hi >= capacity:
        bounded, why = False, f"pinned pages reached the capacity ({hi} of {capacity})"
    elif trending and climbing:
        bounded = False
        why = (
            f"pinned pages grow: {slope * 60:+.2f}/min (p={p:.2g}), +{rise:.0f} over the run; "
            f"last third peaks at {last}, first third at {first} (tolerance {tolerance:.0f})"
        )
    else:
        bounded = True
        why = f"{lo}..{hi} of {capacity}, {slope * 60:+.2f}/min (p={p:.2g})"
    return UsageTrend(*head, slope * 60, p, rise, first, last, tolerance, bounded, why)


class Check(NamedTuple):
    name: str
    verdict: str
    evidence: str

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "evidence": self.evidence}


def check_5xx(status: dict[str, int], first_5xx: Sequence[dict]) -> Check:
    n = status.get("5xx", 0)
    if not n:
        return Check("no-5xx", PASS, f"{sum(status.values())} answers, none 5xx")
    head = first_5xx[0] if first_5xx else {}
    return Check(
        "no-5xx",
        FAIL,
        f"{n} 5xx answers; first: {head.get('name')} {head.get('status')} "
        f"{head.get('body', '')[:160]}",
    )


def check_findings(samples: Sequence[Sample], drained: ProbeReport | None) -> Check:
    hits = [(s.t, f) for s in samples for f in s.findings]
    hits += [(None, f) for f in (findings(drained) if drained else ())]
    if not hits:
        return Check("probe-findings", PASS, f"{len(samples) + bool(drained)} probes, no findings")
    at, first = hits[0]
    when = f"at {at:.1f} s" if at is not None else "after the drain"
    return Check(
        "probe-findings",
        FAIL,
        f"{len(hits)} findings; first {when}: {first.kind} in {first.group}: {first.detail[:200]}",
    )


def check_usage(trends: Sequence[UsageTrend]) -> Check:
    bad = [t for t in trends if not t.bounded]
    if not bad:
        return Check("usage-bounded", PASS, "; ".join(f"{t.group} {t.why}" for t in trends))
    return Check("usage-bounded", FAIL, "; ".join(f"{t.group}: {t.why}" for t in bad))


def check_drain(baseline: ProbeReport, drained: ProbeReport | None) -> Check:
    if drained is None:
        return Check("drain-to-baseline", FAIL, "no probe after the drain")
    left = []
    for group, g in drained.groups.items():
        used, was = g.used, baseline.groups[group].used
        if used != was:
            owners = {k: v for k, v in g.by_owner.items() if v}
            left.append(f"{group} {used} pages used, {was} before the load (by owner {owners})")
    for key in ("live_requests", "live_sessions"):
        now, before = getattr(drained, key), getattr(baseline, key)
        if now != before:
            left.append(f"{now} {key.replace('_', ' ')}, {before} before")
    if left:
        return Check("drain-to-baseline", FAIL, "; ".join(left))
    return Check("drain-to-baseline", PASS, "every pool back at its baseline, nothing live")


def verdict(checks: Sequence[Check], error: str | None) -> str:
    """``error`` when the soak could not be judged, else fail if any check failed."""
    if error is not None:
        return "error"
    return FAIL if any(c.verdict == FAIL for c in checks) else PASS
