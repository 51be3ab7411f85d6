"""The hand-written bugs stay applicable and their section renders from its JSON.

Each bug's text is in its file exactly once, so ``make fresh`` plants it where
it was written (a refactor that moves the text makes this fail: rewrite the
bug against the new code); the planted copy compiles; and the section of
``docs/mutation-score.md`` lists every bug with each tier's verdict.
"""

from __future__ import annotations

import pytest

from mutation import fresh, fresh_report
from mutation.catalog import PACKAGE
from mutation.fresh_bugs import FRESH


@pytest.mark.parametrize("bug", FRESH, ids=[b.id for b in FRESH])
def test_each_bug_plants_once_and_compiles(bug, tmp_path):
    root = fresh.planted(bug, tmp_path)
    text = (root / PACKAGE / bug.file).read_text()
    assert bug.replace in text or not bug.replace
    assert text.count(bug.find) == 0 or bug.find in bug.replace


def test_a_bug_whose_text_moved_is_refused(tmp_path):
    moved = FRESH[0]._replace(find="a text no file holds\n")
    with pytest.raises(ValueError, match="0 times"):
        fresh.planted(moved, tmp_path)


def test_ids_are_unique_and_the_section_lists_every_bug():
    assert len({b.id for b in FRESH}) == len(FRESH)
    results = {
        FRESH[0].id: {
            "quick": {"exit": 0, "detectors": []},
            "default": {"exit": 1, "detectors": ["requests"]},
        }
    }
    lines = "\n".join(fresh_report.section(results))
    assert all(f"`{b.id}`" in lines for b in FRESH)
    assert "**missed**" in lines and "caught (exit 1: `requests`)" in lines
    assert "Caught: quick 0 of 1, default 1 of 1" in lines
    assert fresh_report.section({}) == []


def test_a_tier_counts_only_the_bugs_it_ran():
    """A bug run through the quick tier alone is "not run" for the default gate,
    and neither caught nor missed there."""
    results = {
        FRESH[0].id: {"quick": {"exit": 1, "detectors": ["heap"]}},
        FRESH[1].id: {
            "quick": {"exit": 0, "detectors": []},
            "default": {"exit": 1, "detectors": ["requests"]},
        },
    }
    lines = "\n".join(fresh_report.section(results))
    assert "Caught: quick 1 of 2, default 1 of 1" in lines
    assert "caught (exit 1: `heap`) | not run |" in lines


def test_a_resumed_run_runs_only_the_tiers_a_bug_lacks(monkeypatch, tmp_path):
    ran: list[tuple[str, tuple[str, ...]]] = []
    saved = {FRESH[0].id: {"quick": {"exit": 1, "detectors": ["heap"]}}}
    for bug in FRESH[1:]:
        saved[bug.id] = {t: {"exit": 1, "detectors": []} for t in fresh.TIERS}

    def run_bug(bug, work, tiers):
        ran.append((bug.id, tuple(tiers)))
        return {t: {"exit": 0, "detectors": []} for t in tiers}

    monkeypatch.setattr(fresh, "run_bug", run_bug)
    monkeypatch.setattr(fresh.fresh_report, "load", lambda: saved)
    monkeypatch.setattr(fresh.fresh_report, "save", lambda results: None)
    monkeypatch.setattr(fresh.score_report, "load", lambda doc: ({}, {}))
    monkeypatch.setattr(fresh.score_report, "render", lambda verdicts, meta: "")
    monkeypatch.setattr(fresh.score_report, "DOC", tmp_path / "score.md")
    assert fresh.main(["--work", str(tmp_path)]) == 0
    assert ran == [(FRESH[0].id, ("default",))]
    assert saved[FRESH[0].id]["quick"]["exit"] == 1  # kept, not rerun
