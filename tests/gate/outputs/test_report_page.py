"""report.html from recorded gate output (``data/report-clean``, ``data/report-leak``):
the verdict first, every failure's evidence as visible text (nothing in a
tooltip), per run its requests, failures, coverage and Locust report link."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from paths import DATA

from kvwatch.gate.outputs.report import write_report
from kvwatch.gate.outputs.summary import read_summary
from kvwatch.instrumentation.coverage import MACHINES


class Visible(HTMLParser):
    """The page's text as a reader sees it: text nodes only, no attributes, no style."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.attributes: list[str] = []
        self._skip = False

    def handle_starttag(self, tag, attrs):
        self._skip = tag in ("style", "script", "title")
        self.attributes += [name for name, _ in attrs]

    def handle_endtag(self, tag):
        self._skip = False

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.parts).split())


def build(tmp_path: Path, fixture: str, *, locust_html: tuple[str, ...] = ()) -> tuple[dict, str]:
    """The fixture copied to ``tmp_path``, its report written; returns (summary, page)."""
    out = tmp_path / fixture
    shutil.copytree(DATA / fixture, out)
    for run in locust_html:
        (out / "runs" / run / "locust.html").write_text("<html></html>")
    summary = json.loads((out / "summary.json").read_text())
    return summary, write_report(read_summary(out), out).read_text()


@pytest.fixture(scope="module")
def leak(tmp_path_factory) -> tuple[dict, str]:
    """The failing gate's report; only its c = 1 run has a Locust report."""
    return build(
        tmp_path_factory.mktemp("leak"), "report-leak", locust_html=("streaming-session-c1",)
    )


def visible(page: str) -> Visible:
    parser = Visible()
    parser.feed(page)
    return parser


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_failing_report_says_fail_first_and_writes_out_every_failure(leak):
    summary, page = leak
    seen = visible(page)
    failed = [
        (run, name, d)
        for run in summary["runs"]
        for name, d in run["detectors"].items()
        if d["verdict"] == "fail"
    ]
    assert failed, "the fixture is a failing gate"
    assert seen.text.startswith("kvwatch gate: FAIL")
    for run, name, d in failed:
        where = "after the drain" if d.get("after_drain") else f"at turn {d['first_turn']}"
        head = f"{run['profile']} c={run['concurrency']}: {name} failed {where}"
        assert head in seen.text
        assert flat(d["evidence"]) in seen.text
        for detail in d["details"]:
            assert flat(detail["detail"]) in seen.text
            if detail["pages"]:
                assert "pages " + ", ".join(map(str, detail["pages"][:12])) in seen.text
    assert "title" not in seen.attributes  # no tooltip holds what the page does not show


def test_a_clean_report_says_every_detector_passed(tmp_path):
    summary, page = build(tmp_path, "report-clean")
    seen = visible(page)
    assert summary["verdict"] == "pass"
    assert seen.text.startswith("kvwatch gate: PASS")
    assert f"Every detector passed in all {len(summary['runs'])} runs." in seen.text
    assert "What failed" not in seen.text and "FAIL" not in seen.text
    for run in summary["runs"]:  # passes say why, in the page
        for d in run["detectors"].values():
            assert flat(d["evidence"]) in seen.text


def test_each_run_has_its_counts_coverage_and_locust_report(leak):
    summary, page = leak
    seen = visible(page)
    for run in summary["runs"]:
        row = f"{run['profile']} c={run['concurrency']} {run['turns']} {run['requests']} {run['errors']}"
        assert row in seen.text
        taken = {
            m: sum(1 for t in m_.transitions if run["coverage"].get(m, {}).get(t))
            for m, m_ in MACHINES.items()
        }
        said = ", ".join(f"{m} {n} of {len(MACHINES[m].transitions)}" for m, n in taken.items())
        assert said in seen.text
    assert "href='runs/streaming-session-c1/locust.html'" in page
    assert "runs/streaming-session-c2/locust.html" not in page  # that run's report is absent
    assert "none written" in seen.text


def test_turns_on_the_page_are_numbered_as_in_summary_json(leak):
    summary, page = leak
    text = visible(page).text
    during = [
        (name, d["first_turn"])
        for run in summary["runs"]
        for name, d in run["detectors"].items()
        if d["verdict"] == "fail" and not d.get("after_drain")
    ]
    assert during, "the fixture fails during the turns"
    for name, turn in during:
        assert f"{name} (at turn {turn})" in text
        assert f"{name} (at turn {turn + 1})" not in text
