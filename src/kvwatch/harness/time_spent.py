"""Where a run's time went: the gate's time profile, per run, in summary.json.

Wall-clock seconds from the gate's side, in the order a run goes::

    server_start_s  the profile's server starting (its first run only)
    load_start_s    Locust started, its users set up, the recorder's baseline probe
    warmup_s        the warm-up turns, each with its barrier (drain, probes, samples)
    turns_s         the judged turns, each with its barrier
      settle_s      of those two, the barriers' waits for the engine to finish what
                    the clients left (it is still computing: load)
      barrier_s     and the barriers' probes, flushes and samples at the idle engine
    drain_s         sessions closed, the engine drained and flushed, the last probe
    load_stop_s     Locust stopping and handing its record over
    replay_s        the comparable requests again on the cache-off engine
    run_s           all of it, from the run's start to its record

and, where the server reports it (``GET /debug/timing``), the engine thread's
CPU seconds over the run: ``steps``, ``step_s`` (engine steps), ``watch_s``
(the probe after every step) and ``calls_s`` (probes, flushes and counts the
gate and its recorder asked for between steps).
"""

from __future__ import annotations

from typing import NamedTuple

WALL = (
    "server_start_s",
    "load_start_s",
    "warmup_s",
    "turns_s",
    "drain_s",
    "load_stop_s",
    "replay_s",
)
# parts of warmup_s and turns_s: the barriers' waits, then their probes
BARRIER = ("settle_s", "barrier_s")
ENGINE = ("step_s", "watch_s", "calls_s")


class TimeSpent(NamedTuple):
    run_s: float
    server_start_s: float = 0.0
    load_start_s: float = 0.0
    warmup_s: float = 0.0
    turns_s: float = 0.0
    drain_s: float = 0.0
    load_stop_s: float = 0.0
    replay_s: float = 0.0
    settle_s: float = 0.0
    barrier_s: float = 0.0
    steps: int = 0
    step_s: float = 0.0
    watch_s: float = 0.0
    calls_s: float = 0.0

    def to_json(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self._asdict().items()}

    @classmethod
    def from_json(cls, data: dict | None) -> TimeSpent | None:
        if not data:
            return None
        return cls(**{k: data[k] for k in cls._fields if k in data})


def load_phases(
    spawned: float,
    started: float | None,
    turn_ends: list[float],
    warmup: int,
    ended: float | None,
    exited: float,
) -> dict[str, float]:
    """The load's wall time split at the recorder's marks (epoch seconds): Locust
    spawned, the recorder started, each barrier done, the recorder finished, Locust
    gone. A mark the record lacks (a broken run) leaves its phase at 0."""
    if started is None or not turn_ends or ended is None:
        return {}
    warm_end = turn_ends[min(warmup, len(turn_ends)) - 1] if warmup else started
    return {
        "load_start_s": max(0.0, started - spawned),
        "warmup_s": max(0.0, warm_end - started),
        "turns_s": max(0.0, turn_ends[-1] - warm_end),
        "drain_s": max(0.0, ended - turn_ends[-1]),
        "load_stop_s": max(0.0, exited - ended),
    }


def barrier_phases(settles: list[float], barriers: list[float]) -> dict[str, float]:
    """The barriers' share of the turns: their waits for the engine, their probes."""
    return {"settle_s": sum(settles), "barrier_s": sum(barriers)}


def engine_cpu(before: dict, after: dict) -> dict[str, float]:
    """The engine thread's work over a run: ``/debug/timing`` after minus before."""
    out = {k: after[k] - before[k] for k in ENGINE if k in after and k in before}
    if "steps" in after and "steps" in before:
        out["steps"] = after["steps"] - before["steps"]
    return out
