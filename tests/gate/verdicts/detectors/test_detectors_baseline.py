"""A run is judged on what it added, and a detector that judged nothing never passes.

One engine serves several runs (kvwatch's server a profile's concurrencies,
vLLM the whole gate), so a run may start with findings an earlier run left.
Those are in the run's baseline probe and are not its doing; anything new,
on other pages, other requests or a grown root drift, still fails it. An
engine that had not stepped before the run served no earlier run: what it
carries from its start is the run's to report.
"""

from __future__ import annotations

import pytest
from probes import make_finding, make_probe

from kvwatch.contracts import Finding, FindingKind
from kvwatch.gate.verdicts.detectors import DETECTORS, RunRecord, Turn
from kvwatch.gate.verdicts.detectors.verdict import new_findings, unjudged

ORPHAN = make_finding(FindingKind.ORPHAN)


def run_with(*probes, baseline=None, drained=None, error=None) -> RunRecord:
    turns = tuple(Turn(turn=i, probes=(p,)) for i, p in enumerate(probes))
    base = baseline if baseline is not None else make_probe()
    return RunRecord(
        turns=turns,
        baseline=base,
        drained=drained if drained is not None else base,
        error=error,
    )


@pytest.mark.parametrize(
    "kind, detector",
    [
        (FindingKind.ORPHAN, "allocator"),
        (FindingKind.REF_MISMATCH, "refcount"),
        (FindingKind.TREE, "tree"),
        (FindingKind.REGISTRY, "quiescence"),
        (FindingKind.STARVED, "requests"),
    ],
)
def test_a_finding_already_in_the_baseline_is_an_earlier_runs(kind, detector):
    left = make_probe(findings=(make_finding(kind),))
    served = make_probe(findings=(make_finding(kind),), step=40)  # after an earlier run
    old = run_with(left, left, left, baseline=served, drained=left)
    assert DETECTORS[detector](old).verdict in ("pass", "skipped")
    fresh = run_with(make_probe(), left, left, drained=left)
    verdict = DETECTORS[detector](fresh)
    assert verdict.failed and verdict.first_turn == 1


def test_the_same_rule_on_other_pages_or_other_requests_is_new():
    def vllm_orphan(request: str, pages=(4, 5), count: int = 2) -> Finding:
        detail = f"orphan-holder: request {request} is not live but holds 2 blocks "
        return Finding(
            kind=FindingKind.ORPHAN,
            group="vllm.kv",
            pages=pages,
            detail=detail + f"({count} held by no live request)",
            key=f"orphan-holder|{request}|",
        )

    base = make_probe(findings=(vllm_orphan("A"),), step=40)
    later = make_probe(
        findings=(vllm_orphan("A", count=1), vllm_orphan("B"), vllm_orphan("A", (9,)))
    )
    run = run_with(later, baseline=base)
    # the count in A's detail moved (a live request shares a block): still A's old leak
    assert [f.key for f in new_findings(run, later)] == ["orphan-holder|B|", "orphan-holder|A|"]
    assert [f.pages for f in new_findings(run, later)] == [(4, 5), (9,)]
    verdict = DETECTORS["allocator"](run)
    assert verdict.failed
    # the story counts the run's own leaked pages, not the earlier run's
    assert verdict.story.startswith("vllm.kv leaked pages 3 -> 3 over turn 0")


def test_root_refs_drift_left_by_an_earlier_run_is_not_this_runs_but_more_is():
    before = make_probe(root=(3, 1), step=40)
    assert DETECTORS["refcount"](run_with(before, before, baseline=before)).verdict == "pass"
    grown = run_with(before, make_probe(root=(5, 1)), baseline=before)
    verdict = DETECTORS["refcount"](grown)
    assert verdict.failed and verdict.first_turn == 1
    assert "root refs 5, live holders imply 1 (+2 before the run)" in verdict.evidence[0].detail


def test_the_drain_rule_names_only_leaks_the_run_made():
    base = make_probe(findings=(ORPHAN,), used=2, step=40)
    assert DETECTORS["allocator"](run_with(base, baseline=base, drained=base)).verdict == "pass"
    leaked = make_probe(findings=(ORPHAN, make_finding(FindingKind.ORPHAN, "swa.kv")), used=2)
    verdict = DETECTORS["allocator"](run_with(base, baseline=base, drained=leaked))
    assert verdict.failed and verdict.after_drain
    assert [e.group for e in verdict.evidence] == ["swa.kv"]


@pytest.mark.parametrize("detector", ["allocator", "refcount", "tree", "quiescence", "slot-table"])
def test_a_detector_that_judged_no_turn_is_skipped_with_why_never_passed(detector):
    broke = RunRecord(
        turns=(),
        baseline=make_probe(),
        drained=make_probe(),
        error="no turn barrier completed in 180 s",
    )
    verdict = DETECTORS[detector](broke)
    assert verdict.verdict == "skipped", verdict
    assert "no turn was recorded" in verdict.note and "180 s" in verdict.note
    assert unjudged(run_with(make_probe())) is None


def test_what_an_engine_carries_from_its_start_is_the_first_runs_to_report():
    broken = make_probe(findings=(make_finding(FindingKind.REGISTRY),))  # step 0: never served
    verdict = DETECTORS["quiescence"](run_with(broken, baseline=broken, drained=broken))
    assert verdict.failed and verdict.first_turn == 0
    root = make_probe(root=(2, 1))
    assert DETECTORS["refcount"](run_with(root, baseline=root)).failed
