"""The mutation tooling: operators, mutant trees, the alive oracles (they fail on a
real bug and pass on the clean engine) and the score document."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mutation import catalog as trees
from mutation import fuzz, serverfuzz
from mutation.catalog import catalog, materialize, sample, snapshot
from mutation.operators import OPERATORS, mutate, sites

SOURCE = """
def release(self, holder, pages):
    try:
        self.pool.free(pages[1:n])
    except KeyError:
        self.log(holder)
        raise
    if holder.aborted:
        return
    del self.table[holder.id]
    node = self.owners.pop(holder.id)
    self.tree.unlock(node)
    try:
        self.hand_back(node)
    finally:
        self.ledger.update(node)
    if holder.parked:
        self.notify(holder)
        self.waiting.remove(holder)
"""


def test_every_operator_finds_its_sites():
    found = {s.operator: s for s in sites(SOURCE)}
    assert set(found) == set(OPERATORS)
    by_op = {op: [i for i, s in enumerate(sites(SOURCE)) if s.operator == op] for op in OPERATORS}
    dec = mutate(SOURCE, by_op["unlock-to-dec"][0])
    assert "self.tree.dec(node)" in dec and "unlock" not in dec
    assert "self.owners.get(holder.id)" in mutate(SOURCE, by_op["pop-to-get"][0])
    deleted = [mutate(SOURCE, i) for i in by_op["release-call"]]
    assert any("del self.table" not in m for m in deleted)
    assert any("self.pool.free" not in m for m in deleted)
    moved = {mutate(SOURCE, i).split("free(")[1].split(")")[0] for i in by_op["slice-bound"]}
    assert moved == {"pages[1 - 1:n]", "pages[1 + 1:n]", "pages[1:n - 1]", "pages[1:n + 1]"}
    cleanup = mutate(SOURCE, by_op["skip-cleanup"][0])
    assert "self.log(holder)" not in cleanup and "raise" in cleanup
    assert "if False:" in mutate(SOURCE, by_op["skip-branch"][0])
    narrowing = mutate(SOURCE, by_op["finally-to-except"][0])
    assert "finally:" not in narrowing and "except Exception:" in narrowing
    assert "if holder.parked and holder.aborted:" in mutate(SOURCE, by_op["narrow-if"][0])
    early = mutate(SOURCE, by_op["remove-early"][-1])
    assert early.index("self.waiting.remove(holder)") < early.index("self.notify(holder)")
    assert "self.ledger.copy().update(node)" in mutate(SOURCE, by_op["mutate-copy"][0])
    for i in range(len(sites(SOURCE))):  # every mutant is valid Python
        ast.parse(mutate(SOURCE, i))
    with pytest.raises(IndexError):
        mutate(SOURCE, len(sites(SOURCE)))


def test_the_catalog_is_stable_and_samples_every_operator():
    first, again = catalog(), catalog()
    assert first == again and len({m.id for m in first}) == len(first)
    assert {m.operator for m in first} == set(OPERATORS)
    drawn = sample(first, 30, seed=3)
    assert len(drawn) <= 32 and {m.operator for m in drawn} == set(OPERATORS)
    assert drawn == sample(first, 30, seed=3)


def test_a_mutant_tree_runs_the_mutated_file(tmp_path):
    mutant = next(m for m in catalog() if m.operator == "unlock-to-dec")
    tree = materialize(mutant, tmp_path)
    module = "kvwatch." + mutant.file.removesuffix(".py").replace("/", ".")
    code = f"import {module} as h; print(h.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env={"PYTHONPATH": str(tree)},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out.strip().startswith(str(tree))
    text = (tree / "kvwatch" / mutant.file).read_text()
    assert (
        text.count(".dec(")
        == (trees.SOURCE / trees.PACKAGE / mutant.file).read_text().count(".dec(") + 1
    )


@pytest.mark.slow
def test_the_engine_program_passes_clean_and_sees_a_root_ref_leak():
    for program in fuzz.PROGRAMS:
        assert fuzz.run(program) == [], program
    leaky = replace(fuzz.SETUPS["radix-pressure"], faults=frozenset({"root-ref-leak-on-miss"}))
    fuzz.SETUPS["leaky"] = leaky
    try:
        seen = fuzz.run(fuzz.Program("leaky", 0))
    finally:
        del fuzz.SETUPS["leaky"]
    assert seen and seen[0].oracle == "audit" and "root" in seen[0].detail


def test_the_engine_program_sees_span_events_kept_for_holders_no_request_names(monkeypatch):
    """The span listener holds a cache event until its holder's request is
    scheduled; a failed admission's events, or a session slot's between turns,
    are never claimed. Kept past the queue's last request, they only grow."""
    from kvwatch.instrumentation.spans import RequestSpans

    program = fuzz.Program("slots", 0)
    assert fuzz.run(program) == []
    dequeue = RequestSpans._dequeue

    def dequeue_keeping_early_events(self, live):
        early = dict(self.early)
        dequeue(self, live)
        self.early.update(early)

    monkeypatch.setattr(RequestSpans, "_dequeue", dequeue_keeping_early_events)
    seen = fuzz.run(program)
    assert any(o.oracle == "quiescence" and "RequestSpans.early" in o.detail for o in seen), seen


def test_the_server_program_passes_clean_and_sees_a_stream_kept(monkeypatch):
    program = serverfuzz.PROGRAMS[0]
    assert serverfuzz.run(program) == []
    from kvwatch.server.worker import EngineWorker

    finish = EngineWorker._finish

    def finish_keeping_the_stream(self, request_id):
        stream = self._streams.get(request_id)
        finish(self, request_id)
        if stream is not None:  # ended, but never dropped: a registry that only grows
            self._streams[request_id] = stream

    monkeypatch.setattr(EngineWorker, "_finish", finish_keeping_the_stream)
    seen = serverfuzz.run(program)
    assert any(o.oracle == "quiescence" and "_streams" in o.detail for o in seen), seen


def test_a_stopped_run_resumes_from_its_journal(tmp_path, monkeypatch):
    from mutation import score

    mutants = catalog()[:3]
    judged = []

    def judge(mutant, work, source, reach=None):
        assert work.is_absolute()  # the gates run from the mutant's tree, not from here
        judged.append(mutant.id)
        return score.MutantVerdict(
            mutant=mutant,
            alive=True,
            oracle="audit",
            detail="seen",
            caught_by="fast: chaos",
            detectors=("tree",),
            elapsed_s=1.0,
        )

    monkeypatch.setattr(score, "judge", judge)
    monkeypatch.chdir(tmp_path)
    first = score.run_all(mutants[:2], Path("mutants"), workers=1, progress=lambda _: None)
    assert judged == [m.id for m in mutants[:2]]
    again = score.run_all(mutants, Path("mutants"), workers=1, progress=lambda _: None)
    assert judged == [m.id for m in mutants]  # only the third ran again
    assert again[:2] == first and again[2].mutant == mutants[2]


def test_a_run_makes_its_mutants_from_the_snapshot_it_started_with(tmp_path):
    repo = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(trees.SOURCE / trees.PACKAGE, repo / trees.PACKAGE, ignore=ignore)
    source = snapshot(tmp_path / "source", repo)
    before = catalog(source=source)
    assert before == catalog()  # a copy of the repository as it is
    scheduler = repo / trees.PACKAGE / "engine" / "scheduler.py"
    scheduler.write_text(scheduler.read_text().replace("self.waiting.remove(req)", "pass"))
    assert catalog(source=repo) != before  # the repository moved on ...
    assert snapshot(tmp_path / "source", repo) == source  # ... a resumed run keeps its copy
    assert catalog(source=source) == before
    tree = materialize(before[0], tmp_path / "tree", source)
    assert "self.waiting.remove(req)" in (tree / "kvwatch/engine/scheduler.py").read_text()
    assert (source / "COMMIT").read_text().strip() == "unknown"  # not a git checkout


def test_the_score_document_is_rendered_from_its_verdicts_and_names_its_commit(tmp_path):
    from mutation import score
    from mutation.score_report import load, save

    a, b, c = catalog()[:3]
    verdicts = [
        score.MutantVerdict(
            mutant=a,
            alive=True,
            oracle="audit",
            detail="seen",
            caught_by="fast: chaos",
            detectors=("tree",),
            elapsed_s=1.0,
        ),
        score.MutantVerdict(
            mutant=b,
            alive=True,
            oracle="quiescence",
            detail="a registry kept 3",
            caught_by=None,
            detectors=(),
            elapsed_s=2.0,
        ),
        score.MutantVerdict(
            mutant=c,
            alive=False,
            oracle=None,
            detail="",
            caught_by=None,
            detectors=(),
            elapsed_s=0.5,
        ),
    ]
    doc = tmp_path / "score.md"
    save(verdicts, doc, sites=214, sample=3, seed=0, commit="abc123")
    text = doc.read_text()
    assert "commit `abc123`" in text
    assert "**Score: 1 of 2 alive mutants caught (50%)**" in text and "1 equivalent" in text
    survivors = text.split("## Survivors")[1].split("## Every mutant")[0]
    assert f"`{b.id}`" in survivors and f"`{a.id}`" not in survivors
    assert load(doc) == (verdicts, {"sites": 214, "sample": 3, "seed": 0, "commit": "abc123"})


def test_the_committed_score_is_rendered_from_its_data_and_meets_the_goal():
    """docs/mutation-score.md is what its JSON renders to; the default gate caught at
    least 90 % of the alive mutants; every survivor has a note; every operator ran."""
    from mutation.score_report import DOC, load, render
    from mutation.survivors import NOTES

    verdicts, meta = load(DOC)
    assert DOC.read_text() == render(verdicts, meta)
    alive = [v for v in verdicts if v.alive]
    caught = [v for v in alive if v.caught_by]
    assert alive
    assert len(caught) >= 0.9 * len(alive), f"{len(caught)} of {len(alive)} alive mutants caught"
    survivors = {v.mutant.id for v in alive if not v.caught_by}
    assert survivors <= set(NOTES), survivors - set(NOTES)
    assert {v.mutant.operator for v in verdicts} == set(OPERATORS)
