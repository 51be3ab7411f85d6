"""``kvwatch gate --soak``: continuous agentic load, probed while requests are in
flight, judged on 5xx, findings, bounded usage and drain-to-baseline.

A short clean soak must pass; the same soak with a leaking fault must fail.
These live runs assert only what holds at any machine speed (the run
finished, its verdict, what it wrote); how many requests, probes and
episodes fit in the time is the machine's business. The usage check itself
is shown on stored and generated series in ``test_soak_usage.py``.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvwatch.cli import main
from kvwatch.gate.soak import DETECTORS, parse_duration

CLEAN_SOAK_S = 15


def soak(out: Path, *args: str) -> tuple[int, dict, str]:
    cmd = [sys.executable, "-m", "kvwatch", "gate", "--out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    path = out / "summary.json"
    return (
        proc.returncode,
        json.loads(path.read_text()) if path.exists() else {},
        proc.stdout + proc.stderr,
    )


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> tuple[Path, int, dict, str]:
    out = tmp_path_factory.mktemp("soak")
    junit = out / "junit.xml"
    return (out, *soak(out, "--soak", f"{CLEAN_SOAK_S}s", "--junit", str(junit)))


@pytest.mark.e2e
def test_a_clean_soak_passes_with_requests_probes_and_no_5xx(clean):
    out, code, summary, log = clean
    assert code == 0, log[-3000:]
    assert summary["verdict"] == "pass" and summary["faults"] == []
    assert summary["detectors"] == dict.fromkeys(DETECTORS.ids, "pass")  # the gate's shape
    (run,) = summary["runs"]
    assert run["profile"] == "soak" and run["turns"] >= 1 and run["errors"] == 0
    s = summary["soak"]
    assert s["requests"] > 0 and s["errors"] == 0 and s["http_5xx"] == 0
    assert s["busy_probes"] >= 1, "the probe ran mid-flight"
    assert s["findings"] == 0 and s["probe_errors"] == 0 and s["error"] is None
    assert {name: c["verdict"] for name, c in s["checks"].items()} == dict.fromkeys(
        ("no-5xx", "probe-findings", "usage-bounded", "drain-to-baseline"), "pass"
    )
    for group, u in s["usage"].items():
        assert u["drained_used"] == u["baseline_used"], group
        assert 0 < u["pinned_max"] < u["capacity"], group
    rows = list(csv.DictReader((out / "soak" / "usage.csv").open()))
    assert len(rows) == s["probes"]
    episodes = list(csv.DictReader((out / "soak" / "episodes.csv").open()))
    assert len(episodes) == s["episodes"]
    assert "soak: pass" in log and "drain-to-baseline  pass" in log  # the printed table
    cases = ET.parse(out / "junit.xml").getroot()
    assert cases.get("tests") == str(len(DETECTORS.ids)) and cases.get("failures") == "0"


@pytest.mark.e2e
def test_a_soak_with_a_leaking_fault_fails(tmp_path):
    """session-tail-leak: a resumed session keeps its old tail pages, which the
    streaming-session agents orphan once they close their sessions."""
    code, summary, log = soak(tmp_path, "--soak", "10s", "--inject", "session-tail-leak")
    assert code == 1, log[-3000:]
    s = summary["soak"]
    assert summary["verdict"] == "fail" and summary["faults"] == ["session-tail-leak"]
    assert s["checks"]["probe-findings"]["verdict"] == "fail"
    evidence = s["checks"]["probe-findings"]["evidence"]
    assert "full.kv" in evidence and "held by no live holder" in evidence
    assert s["checks"]["drain-to-baseline"]["verdict"] == "fail"
    assert s["checks"]["no-5xx"]["verdict"] == "pass" and s["requests"] > 0
    assert summary["detectors"]["allocator"] == "fail"


@pytest.mark.parametrize(
    "text, seconds", [("600", 600), ("90s", 90), ("10m", 600), ("1.5h", 5400), (" 2M ", 120)]
)
def test_durations_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "args, message",
    [
        (["--soak", "ten"], "takes a duration like 600, 90s or 10m"),
        (["--soak", "10d"], "takes a duration like 600, 90s or 10m"),
        (["--soak", "-5"], "takes a duration like 600, 90s or 10m"),
        (["--soak", "2s"], "must last 5 s to 7 days"),
        (["--soak", "10m", "-c", "1,2"], "one concurrency"),
        (["--soak", "10m", "-c", "99"], "one concurrency in 1..64"),
        (["--soak", "10m", "--turns", "8"], "does not take --turns"),
        (["--soak", "10m", "--target", "http://x", "--metrics-url", "http://x/m"], "--target"),
        (["--soak", "10m", "--profile", "slot-cache"], "not 'slot-cache'"),
        (["--soak", "10m", "--inject", "no-such-fault"], "unknown fault"),
    ],
)
def test_soak_usage_errors_exit_2(args, message, tmp_path, capsys):
    try:
        code = main(["gate", "--out", str(tmp_path / "out"), *args])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--no-report"], "--no-report"),
        (["--grafana-token", "t"], "--grafana-token"),
        (["--grafana-token="], "--grafana-token"),
        (["--turns", "0"], "--turns"),  # 0 is a value given, though it equals False
    ],
)
def test_soak_refuses_flags_it_would_ignore(args, flag, tmp_path, capsys, monkeypatch):
    """A soak writes no report.html and annotates no Grafana, so ``--no-report`` and
    ``--grafana-token`` are refused like the other turn-only flags (exit 2, one
    line naming the flag), never silently ignored; nothing is written, and no
    soak starts (one that did would fail here at once, not run for ten minutes)."""

    def started(options):
        raise AssertionError(f"the soak started, ignoring {flag}")

    monkeypatch.setattr("kvwatch.gate.soak.run_soak", started)
    code = main(["gate", "--out", str(tmp_path / "out"), "--soak", "10m", *args])
    assert code == 2
    assert capsys.readouterr().err == f"kvwatch gate: --soak does not take {flag}\n"
    assert not (tmp_path / "out").exists()
