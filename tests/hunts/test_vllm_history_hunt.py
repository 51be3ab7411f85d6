"""docs/vllm-history-hunt: every saved history, played again on the vLLM release it names,
still shows the row it is saved for, and a fixed row's history does not show it on the fix;
the report lists them. The report's checks run anywhere; the replays need vLLM's venv and
the releases (``make test-vllm``) and skip without them."""

from __future__ import annotations

import json
import os

import pytest
from paths import REPO

from hunts.vllm_histories import FIXED, LIVE
from kvwatch.histories.hunt import replay_file, run_history
from kvwatch.histories.ops import History
from kvwatch.targets.vllm.histories import Unavailable, VllmHistoryTarget

DOCS = REPO / "docs"
SAVED = sorted((DOCS / "vllm-history-hunt").glob("*.json"))
ROWS = {row.id: row for row in (*LIVE, *(fr.row for fr in FIXED))}
FIX_OF = {fr.row.id: fr for fr in FIXED}
PYTHON = os.environ.get("KVWATCH_VLLM_PYTHON")


def test_the_report_lists_a_saved_history_for_every_row_it_calls_found():
    report = json.loads((DOCS / "vllm-history-hunt.json").read_text())
    saved = {path.name for path in SAVED}
    for run in report["runs"]:
        assert run["saved"] in saved, run
    found = {r["row"] for r in report["runs"] if r["part"] == "newest" and r["row"]}
    assert found | set(report["settings"]["newest"]["missed"]) == {row.id for row in LIVE}
    fixed = [r for r in report["runs"] if r["part"] == "fixed"]
    assert {r["row"] for r in fixed} == set(FIX_OF)
    assert all(r["verdict"] == "re-found" and r["shown_on_fix"] == [] for r in fixed)


@pytest.mark.vllm
@pytest.mark.e2e
@pytest.mark.skipif(not PYTHON, reason="needs vLLM's venv: run `make test-vllm`")
@pytest.mark.parametrize("path", SAVED, ids=[p.stem for p in SAVED])
def test_each_saved_history_still_shows_its_row(path):
    data = json.loads(path.read_text())
    try:
        _, played, verdict = replay_file(path)
    except Unavailable as exc:
        pytest.skip(str(exc))
    if "row" not in data:  # a first finding no row explains: it still fails the same way
        assert set(data["failed"]) <= verdict.failed
        return
    row = ROWS[data["row"]]
    assert row.explains(played, verdict), verdict.findings
    if (fix := FIX_OF.get(row.id)) is not None:
        target = VllmHistoryTarget(version=fix.fixed, setup=data["target"]["setup"])
        with target.opened():
            on_fix = run_history(target, History.from_json(data["history"]))
        assert row.explains(*on_fix) is None, on_fix[1].findings
