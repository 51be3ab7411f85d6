"""A hunt made of gates: ``kvwatch gate`` run over a matrix, one row per run.

Shared by ``sglang/sglang_hunt.py`` and ``lightllm/lightllm_hunt.py``. Each ``Group`` is one
gate process (``python -m kvwatch gate ... --seed S -c C1,C2 --no-report``,
exactly as a user runs it): one engine build (release or checkout, cache,
page size) and one seed, every profile the target runs, at every
concurrency. Its ``summary.json`` and console give one row per
(profile, concurrency):

    verdict       pass | fail | error | unsupported
    findings      [{detector, evidence (first line), known}] of each failed detector
    decided_by    what ran the scheduling (the engine's own code or kvwatch's stand-in),
                  as the target's console says it
    unsupported   why the build cannot run the profile (the target's "leaving out"
                  line, or the engine that could not be loaded): not a finding

``known`` is the id of the corpus row (``docs/real-bugs.json``) that explains
the finding: same engine, detector and pool group (``sglang.kv``,
``lightllm.state``, ... read from the evidence, so a bug of the KV pool is
known under every cache that has one, a bug of the mamba pool only under
the mamba cache), on a build before that row's fix (the engine's
``before_fix``), and either the row's profile or, in another profile, the
same cause (``cause``: the first holder clause with names and numbers
blanked, such as "last held by request # mamba_pool_idx #, aborted-in-queue
at step #"); None marks a candidate. ``relabel`` labels stored rows again
against the corpus as it is now.

Invariant: a row is a function of its group and (profile, concurrency);
groups run side by side (``--jobs``), rows keep the matrix's order.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

LEFT_OUT = re.compile(r"^leaving out the (\S+) profile: (.*)$", re.MULTILINE)
DURING = re.compile(r"turn \d+: ")
POOL = re.compile(r"(?:turn \d+|after the drain): ([a-z_]+\.[a-z_]+):")
CORPUS = Path("docs/real-bugs.json")


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


@dataclass(frozen=True, kw_only=True)
class HuntedEngine:
    """What differs between the engines a gate hunt drives."""

    name: str  # the corpus's engine
    decided_by: Callable[[str], str | None]  # the console -> who decided; None: not loaded
    before_fix: Callable[[str, dict], bool]  # (release, corpus row) -> release has the bug
    profiles: tuple[str, ...] = ()  # every profile of the target (rows of a refused group)
    corpus: list[dict] = field(default_factory=list)


def load_corpus(path: Path = CORPUS) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def flag(args: Sequence[str] | None, name: str, default: str | None = None) -> str | None:
    """The value after ``name`` in a gate command line."""
    args = list(args or ())
    return args[args.index(name) + 1] if name in args else default


def pool_of(evidence: str | None) -> str | None:
    """The pool group an evidence line names first (``sglang.kv``), or None."""
    found = POOL.search(evidence or "")
    return found.group(1) if found else None


def cause(evidence: str | None) -> str:
    """The evidence's first holder clause (or its first clause), names and numbers blanked."""
    text = evidence or ""
    if "last held by" in text:
        text = "last held by" + text.split("last held by", 1)[1]
    text = re.split(r"[;)]", text, maxsplit=1)[0]
    return re.sub(r"[\w.-]*\d[\w.-]*", "#", text).strip()


def buggy_evidence(bug: dict) -> str:
    """The corpus row's evidence on its buggy build (its ``result`` as stored)."""
    found = re.search(r"'evidence': '([^']*)'", str(bug.get("result")))
    return found.group(1) if found else ""


def known(engine: HuntedEngine, row: dict, detector: str, evidence: str) -> str | None:
    """The corpus row that explains ``detector`` failing in ``row`` with ``evidence``, or None."""
    for bug in engine.corpus:
        gate = bug.get("gate")
        if bug.get("engine") != engine.name or not gate or bug.get("expect") != detector:
            continue
        theirs = buggy_evidence(bug)
        if pool_of(theirs) != pool_of(evidence):
            continue
        if flag(gate, "--profile") != row["profile"] and cause(theirs) != cause(evidence):
            continue
        if engine.before_fix(row["release"], bug):
            return bug["id"]
    return None


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:400] if (text or "").strip() else ""


def after_known(findings: list[dict]) -> list[dict]:
    """Findings of the drain in a run a known bug stopped during its turns, labelled with it.

    A run whose turns showed a known bug (a stalled scheduler, a leaked unit) cannot
    drain clean: what is left after the drain (sessions the stalled scheduler never
    closed, the pages they hold) follows from that bug, so it carries its id and
    ``after_known`` rather than standing as a candidate of its own.
    """
    first = next((f["known"] for f in findings if f["known"] and DURING.match(f["evidence"])), None)
    if first is None:
        return findings
    return [
        f | {"known": first, "after_known": True}
        if not f["known"] and f["evidence"].startswith("after the drain")
        else f
        for f in findings
    ]


def relabel(engine: HuntedEngine, rows: list[dict]) -> list[dict]:
    """Stored rows with every finding labelled again against ``engine.corpus``."""
    out = []
    for row in rows:
        fresh = [
            {k: v for k, v in f.items() if k != "after_known"}
            | {"known": known(engine, row, f["detector"], f["evidence"])}
            for f in row["findings"]
        ]
        out.append(row | {"findings": after_known(fresh)})
    return out


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


def hunt(
    engine: HuntedEngine, groups: Sequence[Group], cs: Sequence[int], *, jobs: int, timeout: int
) -> list[dict]:
    """Every group's rows, ``jobs`` gates at a time, in the groups' order."""

    def one(group: Group) -> list[dict]:
        rows = run_group(engine, group, cs, timeout)
        verdicts = " ".join(f"{r['profile']}@{r['c']}:{r['verdict']}" for r in rows)
        print(f"  {group.release} {group.layout} seed {group.seed}: {verdicts}", flush=True)
        return rows

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return [row for rows in pool.map(one, groups) for row in rows]
