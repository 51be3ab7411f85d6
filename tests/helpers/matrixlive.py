"""Running a mutation-matrix cell in a test: one ``kvwatch gate`` process with a fault
built into its server, as ``make matrix`` runs it (``mutation.matrix``).

The faults are split over two test files so the two halves run on both cores;
the concurrencies rotate over the faults in ``CATCHES`` order, so every c runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvwatch.gate.verdicts.catches import CATCHES
from mutation import matrix

ROTATION = [
    matrix.Job(
        fault=fault,
        profile=catch.profile,
        concurrency=matrix.CONCURRENCY[i % len(matrix.CONCURRENCY)],
    )
    for i, (fault, catch) in enumerate(CATCHES.items())
]


def cells_on(*profiles: str) -> list[matrix.Job]:
    return [job for job in ROTATION if job.profile in profiles]


def assert_caught(job: matrix.Job, tmp_path: Path) -> None:
    """The gate exits 1 with the fault's own detector failing, with evidence, and
    says so on its console."""
    # CI-sized: a spread of 24 requests is replayed (make matrix replays them all)
    cell = matrix.run_cell(job, tmp_path, ("--max-replays", "24"))
    log = (tmp_path / f"{job.name}.log").read_text()
    assert cell.holds, f"{matrix.problems([cell])}\n{log[-3000:]}"
    summary = json.loads((tmp_path / job.name / "summary.json").read_text())
    assert summary["verdict"] == "fail" and summary["faults"] == [job.fault]
    caught = summary["runs"][0]["detectors"][cell.expected]
    assert caught["first_turn"] is not None and caught["evidence"], caught
    assert f"FAIL {cell.expected} " in log, log[-2000:]  # with its evidence on the line
