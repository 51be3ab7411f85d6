"""A hunt made of gates: ``kvwatch gate`` run over a matrix, one row per run.

The unit of ``make sglang-hunt`` and ``make lightllm-hunt`` (``sglang.py``,
``lightllm.py`` name the matrix). Each ``Group`` is one gate process
(``python -m kvwatch gate ... --seed S -c C1,C2 --no-report``, exactly as a
user runs it): one engine build (release or checkout, cache, page size) and
one seed, every profile the target runs, at every concurrency. Its
``summary.json`` and console give one row per (profile, concurrency):

    verdict       pass | fail | error | unsupported
    findings      [{detector, evidence (first line), known}] of each failed detector
    decided_by    what ran the scheduling (the engine's own code or kvwatch's stand-in),
                  as the target's console says it
    unsupported   why the build cannot run the profile (the target's "leaving out"
                  line, or the engine that could not be loaded): not a finding

``known`` is the corpus row that explains a finding, or None for a candidate
(``corpus.py``).

Invariant: a row is a function of its group and (profile, concurrency).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hunts import gate_tables, report, runner
from hunts.corpus import HuntedEngine, after_known, known, relabel

LEFT_OUT = re.compile(r"^leaving out the (\S+) profile: (.*)$", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class Group:
    """One gate process: a build of the engine and one seed."""

    release: str  # a release, or a checkout's commit
    cache: str
    page: int
    seed: int
    args: tuple[str, ...]  # the gate's engine flags
    refused: str | None = None  # why this build cannot run at all (no gate is run)

    @property
    def layout(self) -> str:
        return f"{self.cache}/p{self.page}"


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:400] if (text or "").strip() else ""


def verdict_of(row: dict, failed: dict, run: dict) -> str:
    """unsupported (not a finding) over fail over error over pass."""
    if row["unsupported"]:
        return "unsupported"
    if failed:
        return "fail"
    broke = any(v.get("verdict") == "error" for v in run.get("detectors", {}).values())
    return "error" if row["error"] or broke else "pass"


def rows_of(engine: HuntedEngine, group: Group, summary: dict, console: str, cs: Sequence[int]):
    """The group's rows from its gate's ``summary.json`` and console."""
    base = {
        "release": group.release,
        "layout": group.layout,
        "cache": group.cache,
        "page": group.page,
        "seed": group.seed,
    }
    decided = engine.decided_by(console)
    left_out = dict(LEFT_OUT.findall(console))
    rows = []
    for run in summary.get("runs", ()):
        row = base | {"profile": run["profile"], "c": run["concurrency"], "decided_by": decided}
        failed = {d: v for d, v in run.get("detectors", {}).items() if v.get("verdict") == "fail"}
        row["findings"] = []
        for d, v in sorted(failed.items()):
            evidence = first_line(v.get("evidence"))
            row["findings"].append(
                {"detector": d, "evidence": evidence, "known": known(engine, row, d, evidence)}
            )
        row["findings"] = after_known(row["findings"])
        error = run.get("error")
        refused = left_out.get(run["profile"]) or (error if decided is None else None)
        row["unsupported"] = refused if error else None
        row["error"] = None if row["unsupported"] else error
        row["verdict"] = verdict_of(row, failed, run)
        rows.append(row)
    ran = {row["profile"] for row in rows}
    for profile, why in left_out.items():
        if profile in ran:  # every profile was refused: the gate ran them all, as errors
            continue
        rows += [
            base
            | {"profile": profile, "c": c, "decided_by": decided, "findings": []}
            | {"unsupported": why, "error": None, "verdict": "unsupported"}
            for c in cs
        ]
    if not rows:  # the gate broke before any run
        why = first_line(console.strip().splitlines()[-1] if console.strip() else "no output")
        rows.append(
            base
            | {"profile": "*", "c": 0, "decided_by": decided, "findings": []}
            | {"unsupported": None, "error": why, "verdict": "error"}
        )
    return rows


def run_group(engine: HuntedEngine, group: Group, cs: Sequence[int], timeout: int) -> list[dict]:
    """One gate process for ``group``; its rows."""
    if group.refused is not None:
        left_out = "".join(
            f"leaving out the {p} profile: {group.refused}\n" for p in engine.profiles
        )
        return rows_of(engine, group, {}, left_out, cs)
    with tempfile.TemporaryDirectory(prefix="kvwatch-hunt-") as tmp:
        cmd = [sys.executable, "-m", "kvwatch", "gate", *group.args]
        cmd += ["--seed", str(group.seed), "-c", ",".join(map(str, cs))]
        cmd += ["--out", tmp, "--no-report", "--jobs", "1"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
            console = done.stdout + "\n" + done.stderr
        except subprocess.TimeoutExpired:
            console = f"the gate did not finish in {timeout} s"
        path = Path(tmp) / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        return rows_of(engine, group, summary, console, cs)


def plan(
    engine: HuntedEngine,
    groups: Sequence[Group],
    args: Any,
    *,
    matrix: str,
    title: str,
    intro: Sequence[str],
) -> runner.Plan:
    """The hunt over ``groups``: one gate process each (``run_group``), at ``args.c``,
    each given ``args.timeout`` seconds; ``matrix`` says what the hunt crossed, in words."""

    def line(group: Group, rows: list[dict]) -> str:
        verdicts = " ".join(f"{r['profile']}@{r['c']}:{r['verdict']}" for r in rows)
        return f"  {group.release} {group.layout} seed {group.seed}: {verdicts}"

    def footer(rows: list[dict], wall: int) -> str:
        fails = sum(r["verdict"] == "fail" for r in rows)
        return f"{len(rows)} rows in {wall} s: {fails} failed; {args.out}.md"

    return runner.Plan(
        units=groups,
        run=lambda group: run_group(engine, group, args.c, args.timeout),
        line=line,
        header=f"{len(groups)} gates, {args.jobs} at a time",
        markdown=lambda rows, settings: gate_tables.markdown(
            rows, settings, title=title, intro=intro
        ),
        footer=footer,
        settings={"matrix": matrix},
    )


def relabelled(out: Path, engine: HuntedEngine, *, title: str, intro: Sequence[str]) -> int:
    """``out``.json's rows labelled again against the corpus, both files rewritten."""
    stored = json.loads(out.with_suffix(".json").read_text())
    rows = relabel(engine, stored["runs"])
    md = gate_tables.markdown(rows, stored["settings"], title=title, intro=intro)
    report.write(out, stored["settings"], rows, md)
    print(f"{len(rows)} rows labelled again; {out}.md")
    return 0
