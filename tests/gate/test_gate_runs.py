"""``kvwatch gate`` end to end: the engine and Locust each in their own processes.

CI-sized: one profile per run, 6 turns (2 warm-up, 4 judged), a spread of
the comparable requests replayed. The full default run (every profile at
c = 1, 2, 4, 8) is ``make run``; ``test_gate_coverage.py`` runs every profile
at c = 8 with every request replayed.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from serverproc import kvwatch_server

from kvwatch.gate.verdicts.detectors import IDS
from kvwatch.harness.profiles import PROFILES
from kvwatch.harness.time_spent import WALL

pytestmark = pytest.mark.e2e


def gate(out: Path, *args: str, timeout: float = 2400) -> tuple[int, dict, str]:
    cmd = [sys.executable, "-m", "kvwatch", "gate", "--out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return proc.returncode, summary, proc.stderr


def failing(summary: dict) -> set[str]:
    return {name for name, verdict in summary["detectors"].items() if verdict == "fail"}


def test_a_clean_gate_passes_at_each_concurrency_and_writes_its_outputs(tmp_path):
    """c = 1, 2 and 4; test_gate_coverage runs every profile at c = 8 and replays
    every comparable request there."""
    junit = tmp_path / "junit.xml"
    code, summary, err = gate(
        tmp_path,
        *("--profile", "agentic-trie", "-c", "1,2,4", "--junit", str(junit)),
        *("--max-replays", "12"),
    )
    assert code == 0, err[-3000:]
    assert summary["verdict"] == "pass" and summary["faults"] == []
    assert set(summary["detectors"]) == set(IDS)
    assert summary["detectors"]["equivalence"] == "pass"  # replays really ran
    runs = summary["runs"]
    assert [(r["profile"], r["concurrency"]) for r in runs] == [
        ("agentic-trie", c) for c in (1, 2, 4)
    ]
    for run in runs:
        assert run["turns"] == 6 and run["requests"] >= 4 * run["concurrency"] * 6
        assert run["errors"] == 0
        perf = run["performance"]  # the clients' own figures: streams and whole answers
        assert perf["requests"] > 0 and perf["ttft_s"]["p50"] <= perf["e2e_s"]["p99"]
        assert 0 < perf["prefix_cache_hit_rate"] < 1  # agents share a system prompt
        assert {d["verdict"] for d in run["detectors"].values()} <= {"pass", "skipped"}
        spent = run["time"]  # where the run's time went: every phase had some
        phases = [spent[k] for k in WALL if k != "server_start_s"]
        assert all(v > 0 for v in phases) and sum(phases) <= spent["run_s"] + 0.01, spent
        assert (spent["server_start_s"] > 0) == (run["concurrency"] == 1)  # the first run's
        # the barriers' waits and probes are parts of the turns' time
        assert 0 < spent["settle_s"] + spent["barrier_s"] <= spent["warmup_s"] + spent["turns_s"]
        assert spent["steps"] > 0 and spent["step_s"] > 0 and spent["watch_s"] > 0, spent
        where = tmp_path / "runs" / f"agentic-trie-c{run['concurrency']}"
        stats = {r["Name"]: r for r in csv.DictReader((where / "locust_stats.csv").open())}
        assert int(stats["agent turn"]["Request Count"]) > 0
        assert (where / "locust.html").stat().st_size > 0
    report = (tmp_path / "report.html").read_text()
    assert report.count("data:image/png;base64,") >= 2  # usage by owner, latency
    assert "<h2>agentic-trie</h2>" in report and "allocator" in report  # the detector table
    assert "<h2>Where the time went</h2>" in report and "agentic-trie c=4" in report
    assert "<testsuite" in junit.read_text()
    spans = (tmp_path / "spans" / "agentic-trie" / "spans.jsonl").read_text().splitlines()
    assert any(json.loads(line)["name"] for line in spans)
    assert "turn 5: " in err and "(6 of 6 turns" in err  # the progress display, from turn 0


def engine_config(tmp_path: Path, profile: str) -> str:
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(PROFILES[profile].engine_config()))
    return str(path)


@pytest.mark.parametrize("fault", [None, "interior-snapshot-leak"])
def test_black_box_mode_judges_from_gauges_alone(tmp_path, fault):
    """No probe endpoints: only /metrics. The leak shows in the gauges; clean, they stay flat."""
    flags = ["--config", engine_config(tmp_path, "agentic-trie")]
    flags += ["--inject", fault] if fault else []
    with kvwatch_server(*flags) as url:
        code, summary, err = gate(
            tmp_path / "out",
            *("--target", url, "--metrics-url", f"{url}/metrics"),
            *("--profile", "agentic-trie", "-c", "1", "--gauges", "kvwatch"),
        )
    assert set(summary["detectors"]) == {"gauge-trend", "requests"}, err[-3000:]
    if fault is None:
        assert code == 0, err[-3000:]
    else:
        assert code == 1, err[-3000:]
        evidence = summary["runs"][0]["detectors"]["gauge-trend"]["evidence"]
        assert "kvwatch_tree_interior_snapshots" in evidence


def test_the_request_counts_are_what_the_server_answered(tmp_path):
    """The summary's request and failure counts against the server's own access
    log: every request the users made, up to the last one, each counted once.
    The gate itself asks ``GET /v1/models`` once per barrier and once at the
    end to see that a black-box target still answers; those are not the users'."""
    log = tmp_path / "serve.log"
    with kvwatch_server("--log-level", "info", log=log) as url:
        code, summary, err = gate(
            tmp_path / "out",
            *("--target", url, "--metrics-url", f"{url}/metrics"),
            *("--profile", "bad-input", "-c", "8"),
        )
    assert code == 0, err[-3000:]
    answered = [line for line in log.read_text().splitlines() if ' HTTP/1.1" ' in line]
    answered = [line for line in answered if not ("/metrics " in line or "/health " in line)]
    (run,) = summary["runs"]
    assert run["requests"] == len(answered) - (run["turns"] + 1)
    assert run["errors"] == 0 and any('HTTP/1.1" 400' in line for line in answered)


def test_a_distributed_gate_spans_the_barrier_over_two_workers(tmp_path):
    code, summary, err = gate(
        tmp_path,
        "--profile",
        "agentic-trie",
        "-c",
        "4",
        "--locust-workers",
        "2",
        "--max-replays",
        "8",
    )
    assert code == 0, err[-3000:]
    assert summary["verdict"] == "pass" and summary["runs"][0]["errors"] == 0
    record = json.loads((tmp_path / "runs" / "agentic-trie-c4" / "record.json").read_text())
    # every barrier saw all four users (two per worker) report in, sub-agents from turn 1
    assert record["turns"][0]["conversations"] == 4
    assert all(t["conversations"] > 4 for t in record["turns"][1:])
    log = (tmp_path / "runs" / "agentic-trie-c4" / "locust.log").read_text()
    assert "Traceback" not in log
