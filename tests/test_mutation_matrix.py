"""The mutation matrix: every fault in the registry caught at every concurrency by
its detector within four turns of the warm-up; the clean engine passes everything.

This is the slowest test of the suite (about 70 harness runs over two
processes); the table it checks lives in docs/mutation-matrix.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvwatch.engine.faults import Fault
from kvwatch.instrumentation.detectors import FAIL
from kvwatch.instrumentation.harness import HarnessConfig
from kvwatch.instrumentation.matrix import CATCH_WITHIN, CONCURRENCY, PLAN, jobs, render, run_matrix

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[1] / "docs" / "mutation-matrix.md"
LAST_TURN = HarnessConfig.warmup + CATCH_WITHIN - 1


@pytest.fixture(scope="module")
def cells():
    return run_matrix(jobs())


def test_the_plan_covers_every_registered_fault():
    assert set(PLAN) == set(Fault)


def test_every_fault_is_caught_at_every_concurrency(cells):
    missed = [
        f"{c.fault} at c={c.concurrency}: {c.expected} {c.verdicts[c.expected]}"
        for c in cells
        if c.fault and (c.caught_at is None or c.caught_at > LAST_TURN)
    ]
    assert not missed, "faults kvwatch did not catch in time:\n" + "\n".join(missed)
    assert {(c.fault, c.concurrency) for c in cells if c.fault} == {
        (str(f), n) for f in Fault for n in CONCURRENCY
    }


def test_the_clean_engine_passes_every_detector_in_repeated_runs(cells):
    clean = [c for c in cells if c.fault is None]
    assert len({(c.workload, c.concurrency) for c in clean}) * 2 == len(clean)
    false = [
        f"{c.workload} c={c.concurrency} seed={c.seed}: {name} failed at turn {turn}"
        for c in clean
        for name, (verdict, turn) in c.verdicts.items()
        if verdict == FAIL
    ]
    assert not false, "false positives on the clean engine:\n" + "\n".join(false)
    assert not [c for c in cells if c.error and not c.fault]


def test_the_documented_table_matches_this_run(cells):
    """The bold cells (expected detector, first failing turn) of the committed table."""
    bold = re.compile(r"\*\*([^*]+)\*\*")
    ours = [bold.findall(line) for line in render(cells).splitlines()]
    theirs = [bold.findall(line) for line in DOC.read_text().splitlines()]
    assert ours == theirs, (
        "docs/mutation-matrix.md is stale: run "
        "`python -m kvwatch.instrumentation.matrix --out docs/mutation-matrix.md`"
    )
