"""The gate's verdict written out: the typed summary, summary.json's shape, JUnit XML,
exit codes, and a detector that raises failing alone."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from probes import make_probe

from kvwatch.contracts import Finding, FindingKind
from kvwatch.gate.outputs.junit import junit_xml, write_junit
from kvwatch.gate.outputs.summary import EXIT_ERROR, EXIT_FAIL, EXIT_PASS, summarize, write_summary
from kvwatch.gate.verdicts.detectors import IDS, Evidence, RunRecord, Turn, Verdict
from kvwatch.gate.verdicts.judge import RunResult, judge


def verdicts(failing: str | None = None) -> dict[str, Verdict]:
    out = {
        name: Verdict(detector=name, verdict="pass", first_turn=None, evidence=(), note="fine")
        for name in IDS
    }
    out["heap"] = Verdict(
        detector="heap", verdict="skipped", first_turn=None, evidence=(), note="heap tracking off"
    )
    if failing:
        ev = (
            Evidence(group="linear.state", pages=(3, 4), detail="2 pages held by no live holder"),
        )
        out[failing] = Verdict(detector=failing, verdict="fail", first_turn=5, evidence=ev)
    return out


def test_a_clean_run_passes_with_exit_0():
    typed = summarize(
        [
            RunResult(
                profile="agentic-trie",
                concurrency=c,
                turns=6,
                requests=40,
                errors=0,
                verdicts=verdicts(),
            )
            for c in (1, 2)
        ]
    )
    summary = typed.to_json()
    assert summary["verdict"] == "pass" and typed.exit_code == EXIT_PASS
    assert summary["detectors"]["allocator"] == "pass" and summary["detectors"]["heap"] == "skipped"
    run = summary["runs"][0]
    assert set(run) == {
        "profile",
        "concurrency",
        "turns",
        "requests",
        "errors",
        "detectors",
        "timeline",
    }
    assert run["detectors"]["allocator"] == {
        "verdict": "pass",
        "first_turn": None,
        "after_drain": False,
        "evidence": "fine",
        "details": [],
    }


def test_one_failing_detector_fails_the_gate_with_exit_1(tmp_path):
    runs = [
        RunResult(
            profile="agentic-trie",
            concurrency=1,
            turns=6,
            requests=40,
            errors=0,
            verdicts=verdicts(),
        ),
        RunResult(
            profile="agentic-trie",
            concurrency=8,
            turns=6,
            requests=320,
            errors=0,
            verdicts=verdicts("allocator"),
        ),
    ]
    typed = summarize(runs, faults=["abort-state-buffer-leak"])
    summary = typed.to_json()
    assert summary["verdict"] == "fail" and typed.exit_code == EXIT_FAIL
    assert summary["detectors"]["allocator"] == "fail" and summary["faults"] == [
        "abort-state-buffer-leak"
    ]
    failing = summary["runs"][1]["detectors"]["allocator"]
    assert failing["first_turn"] == 5 and "held by no live holder" in failing["evidence"]
    write_summary(typed, tmp_path / "out")
    write_junit(typed, tmp_path / "junit.xml")
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert suite.get("failures") == "1" and suite.get("skipped") == "2"
    assert int(suite.get("tests")) == 2 * len(IDS)
    failure = suite.find(
        ".//testcase[@classname='kvwatch.agentic-trie.c8'][@name='allocator']/failure"
    )
    assert "held by no live holder" in failure.text


def test_a_broken_run_is_an_error_with_exit_3():
    runs = [
        RunResult(
            profile="bad-input",
            concurrency=2,
            turns=3,
            requests=10,
            errors=10,
            verdicts=verdicts(),
            error="the engine process died",
        )
    ]
    summary = summarize(runs)
    assert summary.verdict == "error" and summary.exit_code == EXIT_ERROR
    assert '<error message="the engine process died"' in junit_xml(summary)
    assert summarize([]).exit_code == EXIT_ERROR


def test_a_failed_detector_outranks_a_broken_run():
    """A fault that both trips a detector and then breaks the run is a finding (exit 1)."""
    broken = RunResult(
        profile="abort-storm",
        concurrency=2,
        turns=6,
        requests=10,
        errors=0,
        verdicts=verdicts(),
        error="drain timed out",
    )
    failed = RunResult(
        profile="agentic-trie",
        concurrency=2,
        turns=6,
        requests=10,
        errors=0,
        verdicts=verdicts("allocator"),
    )
    summary = summarize([broken, failed])
    assert summary.verdict == "fail" and summary.exit_code == EXIT_FAIL
    assert summary.to_json()["runs"][0]["error"] == "drain timed out"


def test_a_detector_that_raises_fails_alone_and_the_gate_exits_3(monkeypatch, tmp_path):
    """One detector crashes on a clean record: its verdict is ``error`` with the
    exception as evidence, every other detector still judges the run, the summary
    and JUnit are written, and the gate exits 3. With a real finding beside it the
    finding stands (exit 1)."""
    from kvwatch.gate.verdicts import detectors

    def crash(run):
        raise ZeroDivisionError("no turns to divide by")

    monkeypatch.setitem(
        detectors.REGISTRY, "tree", detectors.REGISTRY["tree"]._replace(detect=crash)
    )
    clean = RunRecord(turns=tuple(Turn(turn=t, probes=(make_probe(),)) for t in range(6)))
    result = judge("agentic-trie", 1, clean, requests=10)
    assert result.verdicts["tree"].verdict == "error"
    assert "ZeroDivisionError: no turns to divide by" in result.verdicts["tree"].evidence[0].detail
    assert any("crash" in line for line in result.verdicts["tree"].evidence[0].traceback)
    others = {n: v.verdict for n, v in result.verdicts.items() if n != "tree"}
    assert others and set(others.values()) <= {"pass", "skipped"}, others
    summary = summarize([result])
    assert summary.verdict == "error" and summary.exit_code == EXIT_ERROR
    assert summary.detectors["tree"] == "error"
    write_summary(summary, tmp_path)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["runs"][0]["detectors"]["tree"]["verdict"] == "error"
    assert written["runs"][0]["detectors"]["allocator"]["verdict"] == "pass"
    suite = ET.fromstring(junit_xml(summary))
    assert suite.get("errors") == "1" and suite.get("failures") == "0"
    leak = Finding(kind=FindingKind.ORPHAN, group="full.kv", pages=(1,), detail="held by no one")
    leaking = RunRecord(turns=(Turn(turn=0, probes=(make_probe(findings=(leak,)),)),))
    both = summarize([result, judge("agentic-trie", 2, leaking, requests=10)])
    assert both.verdict == "fail" and both.exit_code == EXIT_FAIL
