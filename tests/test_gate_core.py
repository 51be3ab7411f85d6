"""Gate verdicts: summary.json shape, JUnit XML, exit codes."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from probes import make_probe

from kvwatch.contracts import Finding, FindingKind
from kvwatch.instrumentation.detectors import IDS, Evidence, HeapSample, RunRecord, Turn, Verdict
from kvwatch.instrumentation.gate import (
    EXIT_ERROR,
    EXIT_FAIL,
    EXIT_PASS,
    RunResult,
    exit_code,
    judge,
    junit_xml,
    summarize,
    write,
)
from kvwatch.loadtests.gate import no_service


def verdicts(failing: str | None = None) -> dict[str, Verdict]:
    out = {name: Verdict(name, "pass", None, (), "fine") for name in IDS}
    out["heap"] = Verdict("heap", "skipped", None, (), "heap tracking off")
    if failing:
        ev = (Evidence("linear.state", (3, 4), "2 pages held by no live holder"),)
        out[failing] = Verdict(failing, "fail", 5, ev)
    return out


def test_a_clean_run_passes_with_exit_0():
    summary = summarize([RunResult("agentic-trie", c, 6, 40, 0, verdicts()) for c in (1, 2)])
    assert summary["verdict"] == "pass" and exit_code(summary) == EXIT_PASS
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
        RunResult("agentic-trie", 1, 6, 40, 0, verdicts()),
        RunResult("agentic-trie", 8, 6, 320, 0, verdicts("allocator")),
    ]
    summary = summarize(runs, faults=["abort-state-buffer-leak"])
    assert summary["verdict"] == "fail" and exit_code(summary) == EXIT_FAIL
    assert summary["detectors"]["allocator"] == "fail" and summary["faults"] == [
        "abort-state-buffer-leak"
    ]
    failing = summary["runs"][1]["detectors"]["allocator"]
    assert failing["first_turn"] == 5 and "held by no live holder" in failing["evidence"]
    write(summary, tmp_path / "out", tmp_path / "junit.xml")
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert suite.get("failures") == "1" and suite.get("skipped") == "2"
    assert int(suite.get("tests")) == 2 * len(IDS)
    failure = suite.find(
        ".//testcase[@classname='kvwatch.agentic-trie.c8'][@name='allocator']/failure"
    )
    assert "held by no live holder" in failure.text


def test_a_broken_run_is_an_error_with_exit_3():
    runs = [RunResult("bad-input", 2, 3, 10, 10, verdicts(), error="the engine process died")]
    summary = summarize(runs)
    assert summary["verdict"] == "error" and exit_code(summary) == EXIT_ERROR
    assert '<error message="the engine process died"' in junit_xml(summary)
    assert exit_code(summarize([])) == EXIT_ERROR


def test_a_failed_detector_outranks_a_broken_run():
    """A fault that both trips a detector and then breaks the run is a finding (exit 1)."""
    broken = RunResult("abort-storm", 2, 6, 10, 0, verdicts(), error="drain timed out")
    failed = RunResult("agentic-trie", 2, 6, 10, 0, verdicts("allocator"))
    summary = summarize([broken, failed])
    assert summary["verdict"] == "fail" and exit_code(summary) == EXIT_FAIL
    assert summary["runs"][0]["error"] == "drain timed out"


def test_judge_runs_the_detectors_over_a_recorded_run():
    leak = Finding(FindingKind.ORPHAN, "linear.state", (9,), "held by no one")
    probe = make_probe(findings=(leak,))
    result = judge("abort-storm", 4, RunRecord((Turn(0, (probe,)),), warmup=0), requests=12)
    assert (
        result.verdicts["allocator"].failed and result.verdicts["equivalence"].verdict == "skipped"
    )
    assert summarize([result])["verdict"] == "fail"


def test_judge_keeps_when_each_barrier_was_reached_and_the_heap_per_token():
    probe = make_probe()
    turns = (
        Turn(0, (probe,), 2, 400, HeapSample(8000, ()), at=1700000000.5),
        Turn(1, (probe,), 2, 0, HeapSample(9000, ()), at=1700000002.0),
        Turn(2, (probe,), 2, 500, None, at=None),
    )
    run = judge("rl-rollout", 1, RunRecord(turns, warmup=0)).as_dict()
    assert run["timeline"] == [
        {"turn": 0, "at": 1700000000.5},
        {"turn": 1, "at": 1700000002.0},
    ]
    # a turn with no context tokens or no heap sample has no ratio
    assert run["heap_bytes_per_context_token"] == [{"turn": 0, "value": 20.0}]


def test_a_run_whose_every_request_failed_was_not_served():
    assert no_service(0, 0) == "no request reached the server"
    assert "every one of the 12 requests failed" in no_service(12, 12)
    assert no_service(12, 11) is None


def test_evidence_names_the_group_once():
    """A detail that already names its group (the audit's "full.kv (host): ...") is not
    prefixed again; one that does not gets the group in front."""
    bare = Evidence("linear.state", (3,), "2 pages held by no live holder")
    named = Evidence("full.kv", (7,), "full.kv (host): 1 pages held twice")
    assert Verdict("allocator", "fail", 2, (bare,)).summary() == (
        "turn 2: linear.state: 2 pages held by no live holder"
    )
    assert Verdict("allocator", "fail", 0, (named, bare)).summary() == (
        "turn 0: full.kv (host): 1 pages held twice (+1 more)"
    )
