"""Score the gate on mutants nobody wrote by hand: ``make mutate``.

    python -m mutation.score [--sample N --seed S] [--only ID ...]

For every mutant (``catalog.py``), on its own copy of the package:

  1. alive?   the engine and server programs (``alive.py``). A mutant no
              oracle sees whose line those programs ran (on the clean code,
              ``reach.py``) is equivalent; one whose line they never ran
              gets the directed programs that do run it (failpoints on, the
              sweep's settings, more seeds): seen there, it is alive; not
              seen, equivalent; run by none of them, **unreached**;
  2. fast     ``kvwatch gate --quick --profile P`` (c = 2, 6 turns, 16
              replays: the pull-request tier) profile by profile, stopping at
              the first that fails (exit 1, or 3 when the run itself broke);
  3. default  a mutant the fast gate missed gets the default gate's
              concurrency extremes, every profile at c = 1 and 8;
  4. sweep    a mutant the default gate missed gets every profile at c = 2
              under each setting of the configuration sweep
              (``matrix.SWEEP``), one gate per setting.

Mutants are made from a snapshot of the repository taken when the run
starts (``WORK/source``, kept while the run resumes): the code can change
meanwhile without mixing versions. Two mutants run at a time (both cores).
The verdicts go to
``docs/mutation-score.json`` and ``docs/mutation-score.md`` is rendered from
that file alone (``report.py``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from mutation.catalog import (
    PACKAGE,
    REPO,
    SOURCE,
    Mutant,
    catalog,
    copy_package,
    enclosing_function,
    materialize,
    sample,
    snapshot,
)
from mutation.matrix import SWEEP, sweep_sets
from mutation.reach import reaching
from mutation.score_report import DOC, save

ALIVE_TIMEOUT_S = 600  # a mutant that hangs the programs is alive (it hangs the engine)
GATE_TIMEOUT_S = 1800
FAST_PROFILES = (
    "agentic-trie",
    "streaming-session",
    "abort-storm",
    "slot-cache",
    "chaos",
    "rl-rollout",
    "bad-input",
    "edges",
)
FAST_FLAGS = ("--quick",)  # every profile of the quick tier, one at a time
DEFAULT_FLAGS = ("-c", "1,8", "--max-replays", "24")
SWEEP_FLAGS = ("-c", "2", "--max-replays", "16")
REACH_TIMEOUT_S = 3600
DIRECTED_TRIES = 3  # directed programs run on a mutant whose line only they reach


class MutantVerdict(NamedTuple):
    """What happened to one mutant."""

    mutant: Mutant
    alive: bool
    oracle: str | None  # the oracle that showed it alive
    detail: str
    caught_by: str | None  # "fast: <profile>", "default" or "sweep: <setting>"; None: missed
    detectors: tuple[str, ...]  # the detectors that failed, or ("run broke",)
    elapsed_s: float
    # what ran the mutant's line: "programs", "directed: <program>, ...", "none"
    # (unreached), or "" (not measured)
    reach: str = ""

    @property
    def outcome(self) -> str:
        if not self.alive:
            return "unreached" if self.reach == "none" else "equivalent"
        return "caught" if self.caught_by else "survived"

    def to_json(self) -> dict:
        return {
            **self.mutant._asdict(),
            "alive": self.alive,
            "oracle": self.oracle,
            "detail": self.detail,
            "caught_by": self.caught_by,
            "detectors": list(self.detectors),
            "elapsed_s": self.elapsed_s,
            "reach": self.reach,
        }

    @classmethod
    def from_json(cls, d: dict) -> MutantVerdict:
        mutant = Mutant(
            file=d["file"],
            ordinal=d["ordinal"],
            operator=d["operator"],
            line=d["line"],
            before=d["before"],
            after=d["after"],
        )
        return cls(
            mutant, d["alive"], d["oracle"], d["detail"], d["caught_by"],
            tuple(d["detectors"]), d["elapsed_s"], d.get("reach", ""),
        )  # fmt: skip


def _env(tree: Path) -> dict[str, str]:
    """The mutant's package first, then the repository's root for the mutation
    programs themselves (it holds no ``kvwatch`` folder to shadow the copy)."""
    path = os.pathsep.join((str(tree), str(REPO)))
    return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def _alive(tree: Path, programs: Sequence[str] = ()) -> dict:
    cmd = [sys.executable, "-m", "mutation.alive", *programs]
    try:
        proc = subprocess.run(
            cmd, cwd=tree, env=_env(tree), capture_output=True, text=True, timeout=ALIVE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return {"alive": True, "oracle": "hang", "detail": f"no end in {ALIVE_TIMEOUT_S} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"alive": True, "oracle": "raised", "detail": tail[:300]}
    return json.loads(lines[-1])


def reach_of(source: Path, work: Path) -> dict:
    """``reach.py``'s lines for the clean code of ``source``, measured once per run
    (``work/reach.json``, kept while the run resumes)."""
    path = work / "reach.json"
    if not path.exists():
        tree = work / "clean"
        shutil.rmtree(tree, ignore_errors=True)
        copy_package(tree, source)
        cmd = [sys.executable, "-m", "mutation.reach", str(path)]
        subprocess.run(cmd, cwd=tree, env=_env(tree), check=True, timeout=REACH_TIMEOUT_S)
        shutil.rmtree(tree, ignore_errors=True)
    return json.loads(path.read_text())


def _unseen(mutant: Mutant, src: Path, source: Path, reach: dict) -> tuple[dict, str]:
    """For a mutant the programs did not see: what the directed programs that run
    its line saw, and what ran it (``MutantVerdict.reach``)."""
    base, directed = reaching(reach, mutant.file, mutant.line)
    unseen = {"alive": False, "oracle": None, "detail": "no oracle saw it"}
    if base:
        return unseen, "programs"
    if not directed:
        where = enclosing_function(source / PACKAGE / mutant.file, mutant.line)
        return {**unseen, "detail": f"no program runs line {mutant.line} (in {where})"}, "none"
    picked = directed[:DIRECTED_TRIES]
    return _alive(src, picked), "directed: " + ", ".join(picked)


def _gate(tree: Path, out: Path, flags: Sequence[str]) -> tuple[int, tuple[str, ...]]:
    """One gate process on the mutant: its exit code and the detectors that failed."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "kvwatch", "gate", *flags, "--seed", "0"]
    cmd += ["--out", str(out), "--no-report"]
    log = out.with_suffix(".log")
    try:
        with log.open("w") as sink:
            proc = subprocess.run(
                cmd, cwd=tree, env=_env(tree), stdout=sink, stderr=subprocess.STDOUT,
                timeout=GATE_TIMEOUT_S,
            )  # fmt: skip
    except subprocess.TimeoutExpired:
        return 3, ("run hung",)
    summary = out / "summary.json"
    failed: list[str] = []
    if summary.exists():
        for run in json.loads(summary.read_text())["runs"]:
            failed += [k for k, v in run["detectors"].items() if v["verdict"] == "fail"]
    if proc.returncode == 3:
        failed.append("run broke")
    elif proc.returncode not in (0, 1):
        raise RuntimeError(f"kvwatch gate exited {proc.returncode} (see {log})")
    return proc.returncode, tuple(dict.fromkeys(failed))


def judge(
    mutant: Mutant, work: Path, source: Path = SOURCE, reach: dict | None = None
) -> MutantVerdict:
    """Steps 1-4 for one mutant (made from ``source``), in its own directory under
    ``work``; ``reach``: the clean code's lines (``reach_of``), or None to skip
    the directed attempt."""
    started = time.monotonic()
    tree = work / mutant.id.replace("/", "_").replace(":", "-")
    shutil.rmtree(tree, ignore_errors=True)
    materialize(mutant, tree / "src", source)
    src = tree / "src"
    alive, reached = _alive(src), "programs"
    if not alive["alive"] and reach is not None:
        alive, reached = _unseen(mutant, src, source, reach)

    def verdict(caught_by: str | None, detectors: tuple[str, ...] = ()) -> MutantVerdict:
        elapsed = round(time.monotonic() - started, 1)
        return MutantVerdict(
            mutant=mutant,
            alive=alive["alive"],
            oracle=alive["oracle"],
            detail=alive["detail"],
            caught_by=caught_by,
            detectors=detectors,
            elapsed_s=elapsed,
            reach=reached,
        )

    try:
        if not alive["alive"]:
            return verdict(None)
        for profile in FAST_PROFILES:
            code, failed = _gate(src, tree / f"fast-{profile}", ("--profile", profile, *FAST_FLAGS))
            if code in (1, 3):
                return verdict(f"fast: {profile}", failed)
        code, failed = _gate(src, tree / "default", DEFAULT_FLAGS)
        if code in (1, 3):
            return verdict("default", failed)
        for setting in SWEEP:
            for profile in FAST_PROFILES:  # a setting's values can be the profile's own
                sets = sweep_sets(setting, profile)
                flags = [*SWEEP_FLAGS, "--profile", profile]
                flags += [a for s in sets for a in ("--engine-set", s)]
                code, failed = _gate(src, tree / f"sweep-{setting}-{profile}", flags)
                if code in (1, 3):
                    return verdict(f"sweep: {setting}", failed)
        return verdict(None, failed)
    finally:
        shutil.rmtree(src, ignore_errors=True)


def run_all(
    mutants: Sequence[Mutant],
    work: Path,
    workers: int = 2,
    progress: Callable[[str], None] | None = None,
    source: Path = SOURCE,
    reach: dict | None = None,
) -> list[MutantVerdict]:
    """Every mutant's verdict, in ``mutants`` order. Each verdict is appended to
    ``work/verdicts.jsonl`` as it comes; a mutant already there is not run again,
    so a run that was stopped resumes where it was. ``reach``: the clean code's
    lines (``reach_of``), for the directed attempt on mutants no program saw."""
    progress = progress or functools.partial(print, flush=True)
    work = work.resolve()  # the gates run from the mutant's tree
    work.mkdir(parents=True, exist_ok=True)
    journal = work / "verdicts.jsonl"
    done: dict[Mutant, MutantVerdict] = {}
    if journal.exists():
        for line in journal.read_text().splitlines():
            v = MutantVerdict.from_json(json.loads(line))
            done[v.mutant] = v
    lock = threading.Lock()

    def one(mutant: Mutant) -> None:
        v = judge(mutant, work, source, reach)
        with lock:
            done[mutant] = v
            with journal.open("a") as f:
                f.write(json.dumps(v.to_json()) + "\n")
        how = f" by {v.caught_by} ({', '.join(v.detectors)})" if v.caught_by else ""
        progress(
            f"[{len(done)}/{len(mutants)}] {mutant.id} {mutant.operator}: "
            f"{v.outcome}{how} ({v.elapsed_s} s)"
        )

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, [m for m in mutants if m not in done]))
    return [done[m] for m in mutants]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOC, help="default: docs/mutation-score.md")
    parser.add_argument("--sample", type=int, help="this many mutants, in proportion per operator")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", help="just this mutant id (file:ordinal)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--work", type=Path, default=Path("kvwatch-out/mutants"),
        help="mutant trees, gate outputs and verdicts.jsonl (a rerun resumes from it)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    source = snapshot(args.work.resolve() / "source")
    commit = (source / "COMMIT").read_text().strip()
    print(f"mutants from {source} (commit {commit}); remove it to judge the code as it is now")
    every = catalog(source=source)
    chosen = (
        [m for m in every if m.id in args.only]
        if args.only
        else sample(every, args.sample, args.seed)
    )
    reach = reach_of(source, args.work.resolve())
    verdicts = run_all(chosen, args.work, args.workers, source=source, reach=reach)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(verdicts, args.out, sites=len(every), sample=args.sample, seed=args.seed, commit=commit)
    caught = sum(v.outcome == "caught" for v in verdicts)
    alive = sum(v.alive for v in verdicts)
    print(f"wrote {args.out}: {len(verdicts)} mutants, {alive} alive, {caught} caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
