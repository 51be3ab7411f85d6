"""The real-bug corpus: ``docs/real-bugs.json`` and the document rendered from it.

Every row follows the schema (``mutation.real_bugs``); every gated row
failed the gate with its expected detector on the release with the bug and
passed on the release with the fix, as ``make real-bugs`` last measured; the
evidence of an SGLang bug names SGLang's objects; a row no gate drives says
why; and the markdown is exactly what the rows render to. The live runs of
the rows marked ``ci`` are in ``test_real_bugs_live.py``.
"""

from __future__ import annotations

import json
import re

import pytest

from kvwatch.gate.verdicts.detectors import IDS
from mutation import real_bugs
from mutation.real_bugs import BugRow, Side

ROWS = real_bugs.load()
GATED = [r for r in ROWS if r.gate is not None]


def test_the_document_is_rendered_from_its_rows():
    assert real_bugs.generated(real_bugs.DOC.read_text()) == real_bugs.render(ROWS), (
        "docs/real-bugs.md does not match docs/real-bugs.json: run `make real-bugs`"
    )


def test_prose_below_the_hand_written_line_is_kept_and_the_rest_regenerated():
    previous = f"an old table xyzzy\n{real_bugs.HAND_WRITTEN}\n## A hunt\n\nprose\n"
    doc = real_bugs.document(ROWS, previous)
    assert doc.endswith(f"\n{real_bugs.HAND_WRITTEN}\n## A hunt\n\nprose\n")
    assert real_bugs.generated(doc) == real_bugs.render(ROWS) and "xyzzy" not in doc
    assert real_bugs.document(ROWS, "no marker") == real_bugs.render(ROWS)


def test_every_row_has_exactly_the_schema_keys():
    keys = set(BugRow.__dataclass_fields__)
    for data in json.loads(real_bugs.CORPUS.read_text()):
        assert set(data) == keys, data["id"]
    assert real_bugs.load() == ROWS and [BugRow.from_json(r.to_json()) for r in ROWS] == ROWS


def test_every_gated_row_fails_before_its_fix_and_passes_after():
    assert {r.id for r in GATED} >= {
        "sglang-pr-22862",
        "sglang-pr-12693",
        "sglang-pr-21404",
        "sglang-pr-23496",
    }
    assert real_bugs.problems(ROWS) == []
    for row in GATED:
        assert row.expect in IDS and row.version_flag in row.argv("V", real_bugs.ROOT)
        bug, fix = row.result["buggy"], row.result["fixed"]
        assert (bug.exit, bug.detector) == (1, row.expect), row.id
        assert (fix.exit, fix.detector, fix.evidence) == (0, None, ""), row.id


@pytest.mark.parametrize("row", [r for r in GATED if r.engine == "sglang"], ids=lambda r: r.id)
def test_sglang_evidence_names_sglangs_objects(row):
    evidence = row.result["buggy"].evidence
    assert re.search(r"sglang\.(kv|mamba|swa)", evidence)
    holder = r"(request \S+|session \S+ SessionSlot (row|mamba slot) \d+)"
    assert re.search(holder, evidence), evidence


def test_what_decides_each_row_is_said_and_only_the_engine_counts():
    assert {r.decided_by for r in ROWS} <= set(real_bugs.DECIDERS)
    assert all(r.decided_by == "engine" for r in ROWS if r.engine == "vllm")
    counted = real_bugs.counted(ROWS)
    assert counted and all(r.decided_by == "engine" and r.gate for r in counted)
    modelled = real_bugs.replace(counted[0], decided_by="modelled")  # a row that holds
    assert real_bugs.problems([modelled]) == [] and real_bugs.counted([modelled]) == []
    assert f"{len(counted)} rows count" in real_bugs.render(ROWS)
    wrong = real_bugs.replace(counted[0], decided_by="guessed")
    assert [p.split(":")[0] for p in real_bugs.problems([wrong])] == [wrong.id]


def test_the_sglang_rows_say_what_their_trigger_is_on_those_releases():
    rows = {r.id: r for r in ROWS}
    seed = rows["sglang-pr-22862"]
    assert "retract" in seed.trigger and "speculative" not in seed.trigger.lower()
    assert "SessionSlot row" in seed.result["buggy"].evidence
    assert (rows["sglang-pr-21404"].buggy, rows["sglang-pr-21404"].fixed) == ("0.5.9", "0.5.10")


def test_a_row_no_gate_drives_says_why_and_how_to_see_it():
    live = [r for r in ROWS if r.gate is None and r.engine == "sglang"]
    assert live, "the suspected live bugs are rows too"
    for row in live:
        assert row.result is None and not row.ci and row.note
        assert "docs/real-bugs/" in row.trigger, row.id  # its reproduction
        script = real_bugs.ROOT / re.search(r"docs/real-bugs/\S+\.py", row.trigger).group(0)
        assert script.is_file(), script


def test_problems_names_a_missed_bug_a_failed_fix_and_a_row_never_run():
    row = next(r for r in GATED if r.id == "sglang-pr-22862")
    missed = row.result | {"buggy": Side(exit=0, detector=None, evidence="")}
    broken = row.result | {"fixed": Side(exit=3, detector=None, evidence="died")}
    other = row.result | {"buggy": Side(exit=1, detector="requests", evidence="x")}
    for result in (missed, broken, other, None):
        wrong = real_bugs.replace(row, result=result)
        assert [p.split(":")[0] for p in real_bugs.problems([wrong])] == [row.id]


def test_a_run_reads_as_its_failing_detector_the_expected_one_first():
    summary = {
        "runs": [
            {"detectors": {"tree": {"verdict": "pass"}}},
            {
                "detectors": {
                    "requests": {"verdict": "fail", "evidence": "2 failed"},
                    "allocator": {"verdict": "fail", "evidence": "orphans"},
                }
            },
        ]
    }
    side = real_bugs.side_of(1, summary, "allocator", "")
    assert side == Side(exit=1, detector="allocator", evidence="orphans")
    assert real_bugs.side_of(1, summary, None, "").detector == "requests"
    assert real_bugs.side_of(0, {"runs": []}, "allocator", "") == Side(0, None, "")
    broke = real_bugs.side_of(3, {"runs": [{"error": "sglang 9 raised X"}]}, "allocator", "")
    assert broke == Side(exit=3, detector=None, evidence="sglang 9 raised X")
    assert real_bugs.side_of(2, None, "allocator", "usage\nkvwatch gate: bad flag\n").evidence == (
        "kvwatch gate: bad flag"
    )
