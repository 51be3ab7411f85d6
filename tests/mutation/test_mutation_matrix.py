"""The mutation matrix document: what ``make matrix`` measured through ``kvwatch gate``.

The cells in ``docs/mutation-matrix.json`` must show every registered fault failing
the gate with its detector at every concurrency and every clean run passing, and
the markdown beside them must be exactly what those cells render to. The live
runs of the same cells are in ``test_mutation_matrix_live.py``.
"""

from __future__ import annotations

from collections import Counter

from kvwatch.engine.faults import Fault
from kvwatch.gate.verdicts.catches import CATCHES, HISTORY_CATCHES
from mutation import matrix

CELLS = matrix.load(matrix.DOC.with_suffix(".json"))


def test_the_document_is_rendered_from_its_cells():
    assert matrix.DOC.read_text() == matrix.render(CELLS), (
        "docs/mutation-matrix.md does not match docs/mutation-matrix.json: run `make matrix`"
    )


def test_the_cells_are_the_planned_ones():
    """Every registered fault a gate profile reaches at c = 1, 2, 4, 8 on that profile,
    and the clean engine on each of those profiles at every c with two seeds, once
    each; the rest are the history tier's (``tests/histories/``)."""
    assert set(CATCHES) | set(HISTORY_CATCHES) == {str(f) for f in Fault}
    assert not set(CATCHES) & set(HISTORY_CATCHES)
    jobs = [c.job for c in CELLS]
    assert Counter(jobs) == Counter(matrix.jobs())


def test_every_fault_fails_the_gate_with_its_detector_and_every_clean_run_passes():
    assert matrix.problems(CELLS) == []
    ran = {(c.job.fault, c.job.config, c.job.concurrency) for c in CELLS}
    assert set(matrix.KNOWN_MISSES) <= ran  # a known miss is a cell that was run
    for cell in CELLS:
        assert cell.requests > 0, cell.job
        job = cell.job
        if (job.fault, job.config, job.concurrency) in matrix.KNOWN_MISSES:
            assert not cell.holds, f"{job.name} is caught now: take it off KNOWN_MISSES"
        elif cell.job.fault:
            verdict, turn = cell.verdicts[cell.expected]
            assert (verdict, cell.exit_code) == ("fail", 1) and turn is not None, cell
        else:
            assert cell.exit_code == 0
            assert {v for v, _ in cell.verdicts.values()} <= {"pass", "skipped"}, cell


def test_problems_names_a_missed_fault_and_a_failed_clean_run():
    """The judge of the cells is not vacuous: a fault that passed, a fault caught by
    another detector only, and a clean run that failed are each reported."""
    fault = next(c for c in CELLS if c.job.fault)
    clean = next(c for c in CELLS if not c.job.fault)
    missed = fault._replace(
        exit_code=0, verdicts={**fault.verdicts, fault.expected: ("pass", None)}
    )
    elsewhere = missed._replace(exit_code=1, verdicts={**missed.verdicts, "requests": ("fail", 0)})
    noisy = clean._replace(exit_code=1, verdicts={**clean.verdicts, "allocator": ("fail", 3)})
    for wrong in (missed, elsewhere, noisy):
        cells = [wrong if c.job == wrong.job else c for c in CELLS]
        assert [p.split(":")[0] for p in matrix.problems(cells)] == [wrong.job.name]
    assert any("no cell" in p for p in matrix.problems(CELLS[1:]))


def test_the_page_size_sweep_keeps_each_profiles_memory():
    """Pages half as long, twice as many: the pools hold the same tokens."""
    sets = matrix.sweep_sets("page-8", "slot-cache")
    assert "cache.full_kv.page_size=8" in sets
    assert "cache.full_kv.capacity=256" in sets  # slot-cache serves 128 pages of 16
    assert "cache.swa_kv.capacity=512" in sets
    assert "cache.full_kv.capacity=2048" in matrix.sweep_sets("page-8", "agentic-trie")
    assert matrix.sweep_sets("spec-off", "slot-cache") == matrix.SWEEP["spec-off"]
    job = matrix.Job(fault=None, profile="slot-cache", concurrency=1, config="page-8")
    argv = job.argv(matrix.DOC.parent)
    assert (
        "cache.full_kv.capacity=256" in argv
        and argv[argv.index("cache.full_kv.capacity=256") - 1] == "--engine-set"
    )
