"""docs/sglang-history-hunt: every saved history, played again on the release it names (the
wheel downloaded at test time, skipped when it cannot be had), still shows the corpus row it
is saved for; a fixed row's history does not show it on the fix; the report lists them."""

from __future__ import annotations

import json

import pytest
from paths import REPO
from sglang_drive import load

from hunts.history_rows import FIXED, LIVE, ROWS
from kvwatch.histories.hunt import replay_file, run_history
from kvwatch.histories.ops import History
from kvwatch.targets.sglang.histories import SglangHistoryTarget

DOCS = REPO / "docs"
SAVED = sorted((DOCS / "sglang-history-hunt").glob("*.json"))
BY_ID = {row.id: row for row in ROWS}
FIX_OF = {fr.row.id: fr for fr in FIXED}


def test_the_report_lists_a_saved_history_for_every_row_it_calls_found():
    report = json.loads((DOCS / "sglang-history-hunt.json").read_text())
    saved = {path.stem for path in SAVED}
    for run in report["runs"]:
        if run["part"] == "live" or run.get("verdict") == "re-found":
            assert run["row"] in saved, run
    found = {run["row"] for run in report["runs"] if run["part"] == "live"}
    assert found | set(report["settings"]["live"]["missed"]) == {row.id for row in LIVE}


@pytest.mark.e2e
@pytest.mark.parametrize("path", SAVED, ids=[p.stem for p in SAVED])
def test_each_saved_history_still_shows_its_row(path):
    data = json.loads(path.read_text())
    load(data["target"]["version"])  # skips when the wheel cannot be had
    _, played, verdict = replay_file(path)
    row = BY_ID[data["row"]]
    assert row.explains(played, verdict), verdict.findings
    if (fix := FIX_OF.get(row.id)) is not None:
        load(fix.fixed)
        target = SglangHistoryTarget(version=fix.fixed, setup=data["target"]["setup"])
        with target.opened():
            on_fix = run_history(target, History.from_json(data["history"]))
        assert row.explains(*on_fix) is None, on_fix[1].findings
