"""``kvwatch histories`` as a user runs it: exit codes, summary.json, saved histories
that ``--replay`` plays again, one-line usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def kvwatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kvwatch", "histories", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.e2e
def test_a_clean_engine_passes_and_a_fault_fails_with_a_file_that_replays(tmp_path):
    clean = kvwatch("--seeds", "0", "--out", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stderr
    summary = json.loads((tmp_path / "clean" / "summary.json").read_text())
    assert summary["verdict"] == "pass" and summary["histories"][0]["failed"] == []
    assert clean.stdout.splitlines()[-1].startswith("verdict: pass")

    out = tmp_path / "fault"
    bad = kvwatch("--seeds", "1-3", "--inject", "session-keeps-unrun-turn", "--out", str(out))
    assert bad.returncode == 1, bad.stderr
    assert "FAIL content:" in bad.stdout
    summary = json.loads((out / "summary.json").read_text())
    saved = [h["saved"] for h in summary["histories"] if h["saved"]]
    assert saved and summary["target"]["faults"] == ["session-keeps-unrun-turn"]
    replay = kvwatch("--replay", str(out / saved[0]))
    assert replay.returncode == 1 and "FAIL content:" in replay.stdout


@pytest.mark.parametrize(
    "args,words",
    [
        (("--seeds", "x"), "--seeds 'x'"),
        (("--inject", "nope"), "unknown fault 'nope'"),
        (("--engine-set", "cache.nope=1"), "nope"),
        (("--turns", "0"), "--turns"),
        (("--sglang-setup", "mamba-sessions"), "go with --engine sglang"),
        (("--engine", "sglang", "--inject", "session-tail-leak"), "go with --engine kvwatch"),
        (("--engine", "vllm", "--inject", "session-tail-leak"), "go with --engine kvwatch"),
        (("--vllm-setup", "async"), "go with --engine vllm"),
        (("--engine", "sglang", "--vllm-version", "0.33.0"), "go with --engine vllm"),
        (("--engine", "vllm", "--vllm-setup", "nope"), "no vLLM setup 'nope'"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args, words, tmp_path):
    done = kvwatch(*args, "--out", str(tmp_path))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], done.stderr


def test_a_file_that_is_not_a_saved_history_is_a_usage_error(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"format": 9}')
    done = kvwatch("--replay", str(path))
    assert done.returncode == 2 and "not a saved history" in done.stderr


def test_a_vllm_that_is_not_here_is_one_line_and_exit_3(tmp_path):
    env = {**os.environ, "KVWATCH_VLLM_PYTHON": str(tmp_path / "no-python")}
    done = kvwatch("--engine", "vllm", "--out", str(tmp_path), env=env)
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no vLLM Python at" in lines[0], done.stderr
