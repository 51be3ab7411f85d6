"""slot-table: more than one entry per slot, or an entry whose hash is not the slot's contents."""

from __future__ import annotations

from kvwatch.contracts import FindingKind
from kvwatch.gate.verdicts.detectors.verdict import Verdict, findings_detector
from kvwatch.harness.run_record import RunRecord, Signal

ID = "slot-table"
NEEDS = frozenset({Signal.PROBES, Signal.SLOTS})


def detect(run: RunRecord) -> Verdict:
    return findings_detector(ID, {FindingKind.SLOT_TABLE}, run)
