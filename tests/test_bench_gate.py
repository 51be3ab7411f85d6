"""Benchmark: ``kvwatch gate`` wall time per profile, the way CI runs it.

`make bench` times every profile at c = 1, 2, 4, 8 with the default turns
(KVWATCH_BENCH_GATE_PROFILES=all); `make test` times one short run as a smoke.
Each profile is its own ``kvwatch gate`` process, so server and Locust start-up
count, as they do in CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from kvwatch.gate.profiles import PROFILES

pytestmark = pytest.mark.e2e

SELECTED = os.environ.get("KVWATCH_BENCH_GATE_PROFILES", "bad-input")
NAMES = list(PROFILES) if SELECTED == "all" else SELECTED.split(",")
CONCURRENCY = os.environ.get("KVWATCH_BENCH_GATE_C", "1")
TURNS = os.environ.get("KVWATCH_BENCH_GATE_TURNS", "6")


@pytest.mark.bench
@pytest.mark.parametrize("profile", NAMES)
def test_gate_wall_time(benchmark, tmp_path, profile):
    cmd = [
        sys.executable,
        "-m",
        "kvwatch",
        "gate",
        "--profile",
        profile,
        "-c",
        CONCURRENCY,
        "--turns",
        TURNS,
        "--out",
        str(tmp_path),
        "--no-report",
    ]
    codes = []

    def run() -> None:
        codes.append(subprocess.run(cmd, capture_output=True, timeout=1800).returncode)

    start = time.perf_counter()
    benchmark.pedantic(run, rounds=1)
    wall = time.perf_counter() - start
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert codes == [0] and summary["verdict"] == "pass"
    benchmark.extra_info.update(
        profile=profile,
        concurrency=CONCURRENCY,
        turns=int(TURNS),
        runs=len(summary["runs"]),
        wall_s=round(wall, 1),
        gate_s=summary["elapsed_s"],
    )
