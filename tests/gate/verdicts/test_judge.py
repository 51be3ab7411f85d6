"""Judging one run: the detectors over its record, what the judged run keeps (when
each barrier was reached, heap bytes per held token, the record in memory), a run
no request was served in, and a verdict's evidence line."""

from __future__ import annotations

from probes import make_probe

from kvwatch.contracts import Finding, FindingKind
from kvwatch.gate.outputs.summary import summarize
from kvwatch.gate.verdicts.detectors import Evidence, HeapSample, RunRecord, Turn, Verdict
from kvwatch.gate.verdicts.judge import judge
from kvwatch.harness.run_record import Counts


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


def test_a_notice_fails_no_detector_and_is_reported_with_the_run():
    """A broken invariant its engine holds harmless (``contracts.NOTICE``) is never
    a pass and never a failure: the judged run carries it, summary.json and the
    console say it, and the same broken count as an error fails refcount."""
    from kvwatch.contracts import NOTICE
    from kvwatch.gate.outputs.console import result_lines
    from kvwatch.gate.verdicts.judge import RunResult

    drift = Finding(
        kind=FindingKind.REF_MISMATCH,
        group="lightllm.kv",
        pages=(),
        detail="lightllm.kv: the root's ref_counter 9 is above 1 + 1 anchored",
        key="root-drift",
        severity=NOTICE,
    )
    turns = tuple(Turn(turn=t, probes=(make_probe(findings=(drift,)),)) for t in (0, 1))
    result = judge("prefix-share", 2, RunRecord(turns=turns, warmup=0), requests=8)
    assert result.verdicts["refcount"].verdict == "pass"
    assert summarize([result]).verdict == "pass"
    assert result.notices == ((0, drift),)  # once, at the first turn that showed it
    data = result.as_dict()
    assert data["notices"] == [{"turn": 0, **drift.to_json()}]
    assert data["notices"][0]["severity"] == "notice"
    assert RunResult.from_json(data).notices == result.notices
    assert f"NOTICE ref_mismatch at turn 0: {drift.detail}" in result_lines(result)
    severe = drift._replace(severity="error")
    judged = judge(
        "prefix-share",
        2,
        RunRecord(turns=(Turn(turn=0, probes=(make_probe(findings=(severe,)),)),), warmup=0),
    )
    assert judged.verdicts["refcount"].failed and judged.notices == ()
