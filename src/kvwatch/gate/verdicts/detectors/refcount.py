"""refcount: the root's and every node's ref counts against what live holders imply."""

from __future__ import annotations

from kvwatch.contracts import FindingKind
from kvwatch.gate.verdicts.detectors.story import probe_story
from kvwatch.gate.verdicts.detectors.verdict import (
    Evidence,
    Verdict,
    fail,
    fail_after_drain,
    inherited,
    new_findings,
    passed,
    skipped,
    unjudged,
)
from kvwatch.harness.run_record import RunRecord, Signal

ID = "refcount"
NEEDS = frozenset({Signal.PROBES})


def detect(run: RunRecord) -> Verdict:
    probes = [(t.turn, p) for t in run.turns for p in t.probes]
    if run.drained is not None:
        probes.append((None, run.drained))  # the probe after the drain
    base = run.baseline.root_refs if inherited(run) else None
    drift = base.actual - base.expected if base is not None else 0  # left by an earlier run
    for turn, probe in probes:
        ev = [
            Evidence(group=f.group, pages=f.pages, detail=f.detail)
            for f in new_findings(run, probe)
            if f.kind is FindingKind.REF_MISMATCH
        ]
        root = probe.root_refs
        if root.actual - root.expected != drift:
            detail = f"root refs {root.actual}, live holders imply {root.expected}"
            detail += f" ({drift:+d} before the run)" if drift else ""
            ev.insert(0, Evidence(group=None, pages=(), detail=detail))
        if ev:
            verdict = fail(ID, turn, ev) if turn is not None else fail_after_drain(ID, run, ev)
            story = probe_story(
                "root refs over what live holders imply",
                run,
                lambda p: p.root_refs.actual - p.root_refs.expected,
            )
            return verdict._replace(story=story)
    if why := unjudged(run):
        return skipped(ID, why)
    return passed(ID, f"root and node refs exact in {len(probes)} probes")
