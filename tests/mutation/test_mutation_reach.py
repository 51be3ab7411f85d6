"""Reach: which lines the mutation programs run, and how a mutant no oracle saw
is judged from it: equivalent where a program ran its line, tried on the
directed programs that run it, unreached where none does."""

from __future__ import annotations

from mutation import fuzz, reach, score
from mutation.catalog import PACKAGE, SOURCE, catalog, enclosing_function

PKG = SOURCE / PACKAGE


def test_lines_run_are_the_lines_a_program_ran_and_no_others():
    files = reach.module_files()
    assert set(files) == set(reach.SCOPE)
    program = fuzz.Program("radix-roomy", 0, operations=12)
    lines = reach.lines_run(lambda: fuzz.run(program), files)
    commit = (PKG / "engine/cache/commit.py").read_text().splitlines()
    insert = next(i for i, t in enumerate(commit, 1) if t.lstrip().startswith("def insert("))
    assert insert + 1 in lines["engine/cache/commit.py"]  # every commit runs it
    # the slot backend's methods never run in a radix program
    slots = (PKG / "engine/cache/slot_backend.py").read_text().splitlines()
    stored = next(i for i, t in enumerate(slots, 1) if "if not s.empty]" in t)
    assert stored not in lines["engine/cache/slot_backend.py"]


def test_the_directed_programs_run_lines_the_base_programs_never_do():
    """Failpoints make a snapshot's allocation fail, which the plain programs'
    pools rarely do: the skip path of a capture runs only in a directed one."""
    files = {"engine/cache/base.py": reach.module_files()["engine/cache/base.py"]}
    base_text = (PKG / "engine/cache/base.py").read_text().splitlines()
    skipped = next(i for i, t in enumerate(base_text, 1) if "SnapshotSkipped(holder.id" in t)
    failing = fuzz.Program("radix-pressure-failpoints", 2)
    assert skipped in reach.lines_run(lambda: fuzz.run(failing), files)["engine/cache/base.py"]
    roomy = fuzz.Program("radix-roomy", 0)
    assert skipped not in reach.lines_run(lambda: fuzz.run(roomy), files)["engine/cache/base.py"]


def test_a_mutant_no_program_saw_is_judged_by_what_runs_its_line(monkeypatch, tmp_path):
    mutant = catalog()[0]
    tried = []

    def alive(tree, programs=()):
        tried.append(tuple(programs))
        return {"alive": bool(programs), "oracle": "audit", "detail": "seen"}

    monkeypatch.setattr(score, "_alive", alive)
    line = {mutant.file: [mutant.line]}
    ran_by_base = {"base": line, "directed": {"x/1": line}}
    assert score._unseen(mutant, tmp_path, SOURCE, ran_by_base)[1] == "programs"
    assert tried == []  # equivalent: a program ran the line and saw nothing
    directed = {"base": {}, "directed": {f"p/{i}": line for i in range(5)} | {"q/0": {}}}
    seen, how = score._unseen(mutant, tmp_path, SOURCE, directed)
    assert seen["alive"] and how == "directed: p/0, p/1, p/2"
    assert tried == [("p/0", "p/1", "p/2")]  # at most three, only those that run it
    nothing, how = score._unseen(mutant, tmp_path, SOURCE, {"base": {}, "directed": {"q/0": {}}})
    assert how == "none" and not nothing["alive"]
    where = enclosing_function(PKG / mutant.file, mutant.line)
    assert nothing["detail"] == f"no program runs line {mutant.line} (in {where})"
    verdict = score.MutantVerdict(
        mutant=mutant,
        alive=False,
        oracle=None,
        detail=nothing["detail"],
        caught_by=None,
        detectors=(),
        elapsed_s=1.0,
        reach=how,
    )
    assert verdict.outcome == "unreached"
    assert verdict._replace(reach="programs").outcome == "equivalent"


def test_every_directed_program_passes_on_the_clean_engine():
    for program in fuzz.DIRECTED[::4]:
        assert fuzz.run(program._replace(operations=40)) == [], program.name
