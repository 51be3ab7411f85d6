"""Benchmark: ``kvwatch gate``'s wall time, the way CI runs it, and where it goes.

``KVWATCH_BENCH_GATE=tiers`` (``make bench``, ``make bench-gate``) times the
two tiers a user runs, each as one ``kvwatch gate`` process with its report,
``KVWATCH_BENCH_GATE_ROUNDS`` times (default 1), round i with ``--seed i``:

    default   every profile at c = 1, 2, 4, 8 (``kvwatch gate``)
    quick     every profile at c = 2 (``kvwatch gate --quick``)

and keeps, per round, the wall time, the gate's own elapsed time, and the
time profile summed over the runs (summary.json's ``runs[].time``:
``harness/time_spent.py``) and per profile. ``gate_md.py`` writes them to
BENCHMARKS.md. Without it (``make test``), one short run is timed as a smoke:
bad-input at c = 1. Both must pass: a gate that got fast by failing is not a
figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from kvwatch.harness.time_spent import BARRIER, ENGINE, WALL

pytestmark = pytest.mark.e2e

SELECTED = os.environ.get("KVWATCH_BENCH_GATE", "smoke")
ROUNDS = int(os.environ.get("KVWATCH_BENCH_GATE_ROUNDS", "1"))
TIERS = {
    "default": (),
    "quick": ("--quick",),
}
SMOKE = {"smoke": ("--profile", "bad-input", "-c", "1", "--no-report")}
CHOSEN = TIERS if SELECTED == "tiers" else SMOKE


def profile_of(summary: dict) -> dict:
    """The runs' time, summed: each wall phase and the engine thread's CPU, over
    every run and per profile (its server start and runs, end to end); and each run's
    own (``runs``: profile, c and its phases)."""
    total: dict[str, float] = defaultdict(float)
    per_profile: dict[str, float] = defaultdict(float)
    keys = (*WALL, *BARRIER, "run_s", "steps", *ENGINE)
    each = []
    for run in summary["runs"]:
        spent = run.get("time") or {}
        for key in keys:
            total[key] += spent.get(key, 0)
        per_profile[run["profile"]] += spent.get("run_s", 0) + spent.get("server_start_s", 0)
        each.append(
            {"profile": run["profile"], "c": run["concurrency"]}
            | {k: round(spent.get(k, 0), 2) for k in keys}
        )
    return {
        "sum": {k: round(v, 1) for k, v in total.items()},
        "profiles": {k: round(v, 1) for k, v in per_profile.items()},
        "runs_time": each,
    }


@pytest.mark.bench
@pytest.mark.parametrize("tier", list(CHOSEN))
def test_gate_wall_time(benchmark, tmp_path, tier):
    rounds: list[dict] = []

    def run() -> None:
        seed = len(rounds) + 1  # each round its own load: the rounds are clean gates too
        out = tmp_path / f"round-{seed}"
        cmd = [sys.executable, "-m", "kvwatch", "gate", *CHOSEN[tier], "--out", str(out)]
        cmd += ["--seed", str(seed)]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - start
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["verdict"] == "pass"
        rounds.append(
            {
                "seed": seed,
                "wall_s": round(wall, 1),
                "gate_s": summary["elapsed_s"],
                "runs": len(summary["runs"]),
                **profile_of(summary),
            }
        )

    benchmark.pedantic(run, rounds=ROUNDS)
    walls = sorted(r["wall_s"] for r in rounds)
    benchmark.extra_info.update(
        tier=tier,
        flags=" ".join(CHOSEN[tier]),
        cores=os.cpu_count(),
        wall_s=walls[len(walls) // 2],
        walls=walls,
        rounds=rounds,
    )
