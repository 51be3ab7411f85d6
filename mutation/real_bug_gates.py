"""Each real-bug row's two ``kvwatch gate`` runs: on the release with the bug, on the fix.

Each run is ``kvwatch gate GATE VERSION_FLAG V --out DIR --no-report`` in a
process of its own, bounded by ``RUN_TIMEOUT_S``; what it showed (``side_of``)
is its exit code, the failing detector (the expected one first) and that
detector's evidence line, or the run's error on exit 3. A LightLLM row names
commits, exported from the git repository ``KVWATCH_LIGHTLLM_REPO`` names;
without it the row keeps its last result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from kvwatch.targets.lightllm.checkout_check import export
from mutation.real_bug_rows import CHECKOUT_FLAG, BugRow, Side

RUN_TIMEOUT_S = 1800

# LightLLM is not on PyPI: its rows name commits, exported from this git repository (a
# clone or a bare git dir); without it they keep their last result and say so
LIGHTLLM_REPO = "KVWATCH_LIGHTLLM_REPO"


def _judged(summary: dict, expect: str | None) -> Side | None:
    """The failing detector of a gate's summary (``expect`` first) and its evidence."""
    failed: dict[str, str] = {}
    for run in summary.get("runs", ()):
        for name, verdict in run.get("detectors", {}).items():
            if verdict.get("verdict") == "fail":
                failed.setdefault(name, verdict.get("evidence", ""))
    if not failed:
        return None
    name = expect if expect in failed else next(iter(failed))
    return Side(exit=1, detector=name, evidence=failed[name])


def side_of(code: int, summary: dict | None, expect: str | None, output: str) -> Side:
    """What one run showed: its exit code, the failing detector and its evidence."""
    judged = _judged(summary or {}, expect)
    if judged is not None:
        return judged._replace(exit=code)
    if code == 0:
        return Side(exit=0, detector=None, evidence="")
    errors = [r["error"] for r in (summary or {}).get("runs", ()) if r.get("error")]
    tail = output.strip().splitlines()[-1:] or ["no output"]
    return Side(exit=code, detector=None, evidence=errors[0] if errors else tail[0])


def run_side(row: BugRow, version: str, where: Path) -> tuple[Side, float]:
    """One ``kvwatch gate`` process on ``version``; what it showed and its seconds."""
    out = where / f"{row.id}-{version}"
    started = time.monotonic()
    given = version
    if row.version_flag == CHECKOUT_FLAG:
        given = str(export(Path(os.environ[LIGHTLLM_REPO]), version, where))
    cmd = [sys.executable, "-m", "kvwatch", *row.argv(given, out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    side = side_of(done.returncode, summary, row.expect, done.stdout + done.stderr)
    return side, time.monotonic() - started


def run_row(row: BugRow, where: Path, say=print) -> BugRow:
    """``row`` with its ``result`` measured (unchanged when no gate drives it, or when
    its commits' repository is not given)."""
    if row.gate is None:
        return row
    if row.version_flag == CHECKOUT_FLAG and not os.environ.get(LIGHTLLM_REPO):
        say(f"{row.id}: not run: set {LIGHTLLM_REPO} to a LightLLM git repository")
        return row
    result = {}
    for name, version in (("buggy", row.buggy), ("fixed", row.fixed)):
        if version is None:
            continue
        result[name], seconds = run_side(row, version, where)
        side = result[name]
        say(f"{row.id}: {version} ({name}) exit {side.exit}, {side.detector} ({seconds:.1f} s)")
    return replace(row, result=result)
