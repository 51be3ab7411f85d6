"""tree: structure invariants (evict set, counters, links, host-ref'd nodes keep their state)."""

from __future__ import annotations

from kvwatch.contracts import FindingKind
from kvwatch.gate.verdicts.detectors.verdict import Verdict, findings_detector
from kvwatch.harness.run_record import RunRecord, Signal

ID = "tree"
NEEDS = frozenset({Signal.PROBES})


def detect(run: RunRecord) -> Verdict:
    return findings_detector(ID, {FindingKind.TREE}, run)
