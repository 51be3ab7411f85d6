"""docs/lightllm-history-hunt: the report lists a saved history for the fixed row it calls
re-found, absent on the fix; played again on the commit it names (exported from
``KVWATCH_LIGHTLLM_REPO``), the saved history still shows its row, and on the fix it does
not. The report's checks run anywhere; the replays skip without a LightLLM repository."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from paths import REPO

from hunts.lightllm_histories import FIXED
from kvwatch.histories.hunt import replay_file
from kvwatch.targets.lightllm.checkout_check import export

DOCS = REPO / "docs"
SAVED = sorted((DOCS / "lightllm-history-hunt").glob("*.json"))
FIX_OF = {fr.row.id: fr for fr in FIXED}


def test_the_report_lists_a_saved_history_for_the_row_it_calls_re_found():
    report = json.loads((DOCS / "lightllm-history-hunt.json").read_text())
    saved = {path.name for path in SAVED}
    fixed = [r for r in report["runs"] if r["part"] == "fixed"]
    assert {r["row"] for r in fixed} == set(FIX_OF)
    for run in fixed:
        assert run["verdict"] == "re-found" and run["shown_on_fix"] == [], run
        assert run["saved"] in saved and run["shown_on_buggy"] > 0, run
    newest = report["settings"]["newest"]
    assert sum(newest["histories"].values()) > 0 and newest["commit"]


@pytest.mark.e2e
@pytest.mark.parametrize("path", SAVED, ids=[p.stem for p in SAVED])
def test_each_saved_history_still_shows_its_row_and_not_on_the_fix(path, tmp_path):
    repo = os.environ.get("KVWATCH_LIGHTLLM_REPO")
    if not repo:
        pytest.skip("set KVWATCH_LIGHTLLM_REPO to a LightLLM git repository (not on PyPI)")
    data = json.loads(path.read_text())
    fix = FIX_OF[data["row"]]
    buggy = export(Path(repo), data["target"]["commit"], tmp_path)
    _, played, verdict = replay_file(path, src=str(buggy))
    assert fix.row.explains(played, verdict), verdict.findings
    fixed = export(Path(repo), fix.fixed, tmp_path)
    _, played, verdict = replay_file(path, src=str(fixed))
    assert fix.row.explains(played, verdict) is None, verdict.findings
