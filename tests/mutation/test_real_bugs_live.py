"""The real-bug rows marked ``ci`` through ``kvwatch gate``, on the releases themselves.

Each SGLang row's pair runs as a user runs it: ``kvwatch gate --engine
sglang-cache ... --sglang-version V`` in a process of its own, the release's
wheel downloaded from PyPI at test time into kvwatch's cache folder
(``$KVWATCH_CACHE`` or ``~/.cache/kvwatch``; once per machine). With the bug
the gate exits 1 with the row's detector failing on evidence that names
SGLang's objects; with the fix it exits 0. Seed 001 (SGLang PR #22862) first:
0.5.10.post1 leaks the tail of each streaming session's slot when a turn is
retracted, 0.5.11 does not. Every SGLang row runs through SGLang's own
``Scheduler``.
The two gates of a row run side by side (two processes). Skipped, saying
why, when PyPI cannot be reached.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvwatch.targets.sglang import wheel_fetch
from mutation import real_bugs

pytestmark = pytest.mark.e2e
ROWS = {r.id: r for r in real_bugs.load() if r.ci and r.engine == "sglang"}
SEED_001 = "sglang-pr-22862"


def fetched(*versions: str) -> None:
    for version in versions:
        try:
            wheel_fetch.fetch(version)
        except wheel_fetch.Unavailable as exc:
            pytest.skip(f"cannot download sglang {version}'s wheel (is PyPI reachable?): {exc}")


def gates(row: real_bugs.BugRow, tmp_path) -> dict[str, tuple[int, dict, str]]:
    """Both gates of ``row``, run at once: version -> (exit, summary, output)."""
    running = {}
    for version in (row.buggy, row.fixed):
        cmd = [sys.executable, "-m", "kvwatch", *row.argv(version, tmp_path / version)]
        running[version] = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    out = {}
    for version, process in running.items():
        output, _ = process.communicate(timeout=600)
        summary = json.loads((tmp_path / version / "summary.json").read_text())
        out[version] = (process.returncode, summary, output)
    return out


def test_seed_001_fails_on_0_5_10_post1_and_passes_on_0_5_11(tmp_path):
    row = ROWS[SEED_001]
    fetched(row.buggy, row.fixed)
    ran = gates(row, tmp_path)
    code, summary, output = ran[row.buggy]
    assert code == 1, output
    verdict = summary["runs"][0]["detectors"]["allocator"]
    assert verdict["verdict"] == "fail", verdict
    assert "sglang.kv" in verdict["evidence"] and "allocated but held by no" in verdict["evidence"]
    assert "session sess" in verdict["evidence"] and "SessionSlot row" in verdict["evidence"]
    assert summary["target"] == "sglang-cache"
    code, summary, output = ran[row.fixed]
    assert code == 0, output
    assert summary["verdict"] == "pass"


@pytest.mark.parametrize("row_id", sorted(set(ROWS) - {SEED_001}))
def test_each_ci_row_fails_before_its_fix_and_passes_after(row_id, tmp_path):
    row = ROWS[row_id]
    fetched(row.buggy, row.fixed)
    ran = gates(row, tmp_path)
    code, summary, output = ran[row.buggy]
    side = real_bugs.side_of(code, summary, row.expect, output)
    assert (side.exit, side.detector) == (1, row.expect), output
    assert "request " in side.evidence or "session " in side.evidence, side.evidence
    code, _, output = ran[row.fixed]
    assert code == 0, output
