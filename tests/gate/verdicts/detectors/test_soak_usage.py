"""The soak's usage check on stored and generated series, never on a live one.

A live soak records as many probes and episodes as the machine's speed
allows, so its series cannot show the judge right or wrong. Here the judge
reads a real clean soak kept in ``tests/data/soak-clean-120s/`` (120 s at
c = 4 on 2 quiet cores: pinned pages by group per probe, and when each user
ended each episode) and series generated from a seed: users whose contexts
grow turn by turn and drop when their episode ends, with what is in flight
on top. Each must pass as it is and fail once a steady leak is added.
"""

from __future__ import annotations

import csv
import json
from typing import NamedTuple

import numpy as np
import pytest
from paths import DATA

from kvwatch.gate.verdicts.detectors import usage_trend as judge

STORED = DATA / "soak-clean-120s"
WARMUP_FRACTION = 0.2  # SoakOptions' default


class Series(NamedTuple):
    duration: float
    users: int
    capacity: dict[str, int]
    times: np.ndarray
    pinned: dict[str, np.ndarray]
    episode_ends: list[tuple[int, float]]

    def trend(self, group: str, pinned: np.ndarray | None = None) -> judge.UsageTrend:
        return judge.usage_trend(
            group,
            self.capacity[group],
            self.times,
            self.pinned[group] if pinned is None else pinned,
            WARMUP_FRACTION * self.duration,
            self.users,
            self.episode_ends,
        )

    def leak(self, group: str, tolerances: float) -> np.ndarray:
        """The group's series plus a leak that adds ``tolerances`` x the check's
        tolerance over the run, in whole pages, probe by probe."""
        added = np.floor(
            tolerances * judge.tolerance(self.capacity[group]) * self.times / self.duration
        )
        added = added.astype(int)
        return self.pinned[group] + added


def stored() -> Series:
    meta = json.loads((STORED / "soak.json").read_text())
    rows = list(csv.DictReader((STORED / "usage.csv").open()))
    loaded = [r for r in rows if float(r["t_s"]) <= meta["duration_s"]]
    ends = [
        (int(r["user"]), float(r["t_s"])) for r in csv.DictReader((STORED / "episodes.csv").open())
    ]
    return Series(
        meta["duration_s"],
        meta["concurrency"],
        meta["capacity"],
        np.array([float(r["t_s"]) for r in loaded]),
        {g: np.array([int(r[f"{g}.pinned"]) for r in loaded]) for g in meta["capacity"]},
        ends,
    )


def generated(seed: int, duration: float = 120.0, users: int = 4, every: float = 2.0) -> Series:
    """A clean soak's shape: each user's context grows by a few pages a turn and is
    dropped when its episode (six turns of random length) ends; probes see that,
    plus pages of requests in flight."""
    rng = np.random.default_rng(seed)
    times = np.arange(0.0, duration, every)
    capacity = {"full.kv": 1024, "linear.state": 96}
    per_turn = {"full.kv": 6.0, "linear.state": 0.6}
    pinned = {g: np.zeros(len(times)) for g in capacity}
    ends = []
    for user in range(users):
        t, base = 0.0, {g: 0.0 for g in capacity}
        while t < duration:
            turn_starts = t + np.cumsum(rng.uniform(0.5, 1.5, 6))
            in_episode = (times >= t) & (times < turn_starts[-1])
            turn = np.searchsorted(turn_starts, times[in_episode])
            for g in capacity:
                pinned[g][in_episode] += per_turn[g] * (turn + 1) + base[g]
            t = float(turn_starts[-1])
            ends.append((user, t))
    for g in capacity:
        pinned[g] += rng.poisson(per_turn[g] * 3, len(times))  # requests in flight
    return Series(
        duration,
        users,
        capacity,
        times,
        {g: np.rint(v).astype(int) for g, v in pinned.items()},
        [(u, t) for u, t in ends if t <= duration],
    )


def test_the_stored_clean_soak_is_bounded_in_every_group():
    s = stored()
    assert len(s.times) > 50 and s.users == 4
    for group in s.capacity:
        trend = s.trend(group)
        assert trend.bounded, trend
        assert "too short" not in trend.why, trend.why  # 120 s holds enough episodes to judge


def test_a_steady_leak_added_to_the_stored_soak_is_caught_in_every_group():
    s = stored()
    for group in s.capacity:
        trend = s.trend(group, s.leak(group, 4))
        assert not trend.bounded and "grow" in trend.why, (group, trend)
        full = s.trend(group, np.maximum(s.pinned[group], s.capacity[group]))
        assert not full.bounded and "reached the capacity" in full.why


@pytest.mark.parametrize("seed", range(12))
def test_generated_clean_soaks_pass_and_the_same_soaks_with_a_leak_fail(seed):
    s = generated(seed)
    for group in s.capacity:
        clean = s.trend(group)
        assert clean.bounded and "too short" not in clean.why, (seed, group, clean)
        leaking = s.trend(group, s.leak(group, 4))
        assert not leaking.bounded and "grow" in leaking.why, (seed, group, leaking)


def test_a_soak_shorter_than_two_episodes_per_user_judges_headroom_only():
    """A slow machine's soak: each user ended its first episode and then one more.
    Its pinned pages may climb all along (a partial episode), which must not be
    taken for a leak; only running out of pages still fails it."""
    s = generated(0, duration=12.0)
    ends = {u: sum(1 for v, _ in s.episode_ends if v == u) for u in range(s.users)}
    assert min(ends.values()) >= 1
    rising = np.arange(len(s.times)) * 20  # + 20 pages per probe, well past the tolerance
    trend = s.trend("full.kv", rising % 1000)
    assert trend.bounded and "too short for a trend" in trend.why, trend
    full = s.trend("full.kv", np.full(len(s.times), 1024))
    assert not full.bounded and "headroom only" in full.why


def test_the_trend_starts_once_every_user_ended_an_episode():
    ends = [(0, 5.0), (1, 9.0), (0, 11.0), (1, 14.0), (0, 17.0), (1, 20.0), (0, 23.0)]
    assert judge.judged_from(3.0, 2, ends, 30.0) == (9.0, None)  # user 0: 3 ends after 9, user 1: 2
    start, why = judge.judged_from(3.0, 2, ends, 19.0)  # user 1 ended one more by then
    assert start == 9.0 and "1 whole episodes of the slowest user" in why
    start, why = judge.judged_from(12.0, 3, ends, 30.0)  # a third user never ended one
    assert "2 of 3 users ended an episode" in why
    assert judge.judged_from(10.0, 2, ends, 30.0)[0] == 10.0  # the warm-up is later
