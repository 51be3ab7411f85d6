"""Notices in every output: a passing JUnit case with the notices in its output (a failure
with --strict), a section of the HTML report, and --strict failing the gate on a notice
alone with the verdict line saying why; without a notice --strict changes nothing."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from probes import make_probe

from kvwatch.contracts import NOTICE, Finding, FindingKind
from kvwatch.gate.outputs import report_text
from kvwatch.gate.outputs.junit import junit_xml
from kvwatch.gate.outputs.summary import EXIT_FAIL, EXIT_PASS, GateSummary, summarize
from kvwatch.gate.verdicts.detectors import RunRecord, Turn
from kvwatch.gate.verdicts.judge import judge

DRIFT = Finding(
    kind=FindingKind.REF_MISMATCH,
    group="lightllm.kv",
    pages=(),
    detail="the root's ref_counter 9 is above 1 + 1 anchored",
    key="root-drift",
    severity=NOTICE,
)


def run(noticed: bool):
    findings = (DRIFT,) if noticed else ()
    turns = tuple(Turn(turn=t, probes=(make_probe(findings=findings),)) for t in (0, 1))
    return judge("prefix-share", 2, RunRecord(turns=turns, warmup=0), requests=8)


def cases(summary: GateSummary) -> dict[str, ET.Element]:
    suite = ET.fromstring(junit_xml(summary))
    return {case.get("name"): case for case in suite.iter("testcase")}


def test_a_notice_is_a_passing_junit_case_and_a_report_section_without_strict():
    summary = summarize([run(noticed=True)])
    assert summary.verdict == "pass" and summary.exit_code == EXIT_PASS and summary.why() == ""
    case = cases(summary)["notices"]
    assert case.find("failure") is None
    assert DRIFT.detail in case.find("system-out").text
    suite = ET.fromstring(junit_xml(summary))
    assert suite.get("failures") == "0"
    section = report_text.notices(summary)
    assert "<h2>Notices</h2>" in section and "ref_mismatch" in section
    assert "--strict fails the gate on any" in section


def test_strict_fails_the_gate_on_a_notice_alone_and_says_so():
    summary = summarize([run(noticed=True)], strict=True)
    assert summary.verdict == "fail" and summary.exit_code == EXIT_FAIL
    assert all(v == "pass" for k, v in summary.detectors.items() if v != "skipped")
    assert summary.why() == " with --strict: 1 notices"
    assert summary.to_json()["strict"] is True
    assert GateSummary.from_json(summary.to_json()).strict is True
    failure = cases(summary)["notices"].find("failure")
    assert failure is not None and DRIFT.detail in failure.text
    assert ET.fromstring(junit_xml(summary)).get("failures") == "1"
    assert "With --strict they fail this gate." in report_text.notices(summary)


def test_strict_without_a_notice_changes_nothing():
    summary = summarize([run(noticed=False)], strict=True)
    assert summary.verdict == "pass" and summary.why() == ""
    assert "notices" not in cases(summary)
    assert report_text.notices(summary) == ""
