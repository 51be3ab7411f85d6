"""Gate verdicts: the typed summary, summary.json's shape, JUnit XML, exit codes, and a
detector that raises failing alone."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from probes import make_probe

from kvwatch.contracts import Finding, FindingKind
from kvwatch.gate.outputs.junit import junit_xml, write_junit
from kvwatch.gate.outputs.summary import EXIT_ERROR, EXIT_FAIL, EXIT_PASS, summarize, write_summary
from kvwatch.gate.verdicts.detectors import IDS, Evidence, HeapSample, RunRecord, Turn, Verdict
from kvwatch.gate.verdicts.judge import RunResult, judge
from kvwatch.harness.run_record import Counts


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


def test_judge_runs_the_detectors_over_a_recorded_run():
    leak = Finding(
        kind=FindingKind.ORPHAN, group="linear.state", pages=(9,), detail="held by no one"
    )
    probe = make_probe(findings=(leak,))
    result = judge(
        "abort-storm", 4, RunRecord(turns=(Turn(turn=0, probes=(probe,)),), warmup=0), requests=12
    )
    assert (
        result.verdicts["allocator"].failed and result.verdicts["equivalence"].verdict == "skipped"
    )
    assert summarize([result]).verdict == "fail"
    assert result.record is not None and result.record.turns[0].probes == (probe,)  # in memory


def test_judge_keeps_when_each_barrier_was_reached_and_the_heap_per_token():
    probe = make_probe()
    turns = (
        Turn(
            turn=0,
            probes=(probe,),
            conversations=2,
            context_tokens=400,
            heap=HeapSample(traced_bytes=8000, top=()),
            at=1700000000.5,
        ),
        Turn(
            turn=1,
            probes=(probe,),
            conversations=2,
            context_tokens=0,
            heap=HeapSample(traced_bytes=9000, top=()),
            at=1700000002.0,
        ),
        Turn(turn=2, probes=(probe,), conversations=2, context_tokens=500, heap=None, at=None),
    )
    run = judge("rl-rollout", 1, RunRecord(turns=turns, warmup=0)).as_dict()
    assert run["timeline"] == [
        {"turn": 0, "at": 1700000000.5},
        {"turn": 1, "at": 1700000002.0},
    ]
    # a turn with no context tokens or no heap sample has no ratio
    assert run["heap_bytes_per_context_token"] == [{"turn": 0, "value": 20.0}]


def test_a_run_whose_every_request_failed_was_not_served():
    def sent(ok: int, failed: int) -> Counts:
        return Counts(status={"2xx": ok, "5xx": failed}, failed=failed, broken_turns=0)

    assert sent(0, 0).unserved() == "no request reached the server"
    assert "every one of the 12 requests failed" in sent(0, 12).unserved()
    assert sent(1, 11).unserved() is None


def test_evidence_names_the_group_once():
    """A detail that already names its group (the audit's "full.kv (host): ...") is not
    prefixed again; one that does not gets the group in front."""
    bare = Evidence(group="linear.state", pages=(3,), detail="2 pages held by no live holder")
    named = Evidence(group="full.kv", pages=(7,), detail="full.kv (host): 1 pages held twice")
    assert Verdict(
        detector="allocator", verdict="fail", first_turn=2, evidence=(bare,)
    ).summary() == ("turn 2: linear.state: 2 pages held by no live holder")
    assert Verdict(
        detector="allocator", verdict="fail", first_turn=0, evidence=(named, bare)
    ).summary() == ("turn 0: full.kv (host): 1 pages held twice (+1 more)")


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
