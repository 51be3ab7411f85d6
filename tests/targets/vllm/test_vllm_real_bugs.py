"""vLLM's rows of the real-bug corpus (``docs/real-bugs.json``), each gated twice.

A row names a fix, the release that shipped the bug and the release that
fixed it, and the gate that tells them apart: ``kvwatch gate GATE
--vllm-version BUGGY`` must exit 1 with the row's detector failing, and
``--vllm-version FIXED`` must exit 0. ``make test-vllm`` unpacks the releases
these need (``make vllm-release V=...``) and points ``KVWATCH_VLLM_PYTHON`` at
``.venv-vllm``; without them these skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

from kvwatch.targets.vllm.release import find

ROOT = REPO
CORPUS = ROOT / "docs" / "real-bugs.json"
PYTHON = os.environ.get("KVWATCH_VLLM_PYTHON")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.e2e,
    pytest.mark.skipif(not PYTHON, reason="needs vLLM's venv: run `make test-vllm`"),
]


def vllm_rows() -> list[dict]:
    rows = json.loads(CORPUS.read_text()) if CORPUS.exists() else []
    return [r for r in rows if r["engine"] == "vllm" and r["gate"] and r["ci"]]


def gate(row: dict, version: str, out: Path) -> tuple[int, dict, str]:
    try:
        find(version, PYTHON)
    except ValueError as exc:
        pytest.skip(str(exc))
    cmd = [sys.executable, "-m", "kvwatch", "gate", *row["gate"], row["version_flag"], version]
    cmd += ["--out", str(out), "--no-report", "--vllm-python", PYTHON]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    summary = json.loads((out / "summary.json").read_text())
    return proc.returncode, summary, proc.stdout + proc.stderr


def test_the_corpus_has_a_vllm_row_for_each_fix_this_gate_tells_apart():
    ids = {r["id"] for r in vllm_rows()}
    assert {"vllm-issue-49377", "vllm-pr-49206", "vllm-pr-44490"} <= ids


@pytest.mark.parametrize("row", vllm_rows(), ids=lambda r: r["id"])
def test_the_release_with_the_bug_fails_and_the_release_with_the_fix_passes(row, tmp_path):
    code, summary, log = gate(row, row["buggy"], tmp_path / "buggy")
    assert code == 1, log[-3000:]
    failed = {
        d for r in summary["runs"] for d, v in r["detectors"].items() if v["verdict"] == "fail"
    }
    assert failed == {row["expect"]}, summary["runs"]
    code, summary, log = gate(row, row["fixed"], tmp_path / "fixed")
    assert code == 0, log[-3000:]
    assert summary["verdict"] == "pass"
