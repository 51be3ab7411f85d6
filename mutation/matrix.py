"""The mutation matrix: every registered fault through ``kvwatch gate`` at every
concurrency, and the clean engine beside it.

    python -m mutation.matrix          # what `make matrix` runs

A cell is one ``kvwatch gate --profile P -c C [--inject F] --seed S`` process:
its own server, real Locust users, the HTTP probes, the same detectors and
exit code a user gets. Cells run on fresh servers (a fault is fixed when the
engine is built), two at a time. ``catches.CATCHES`` names each fault's
profile and the detector that must fail; every fault must fail the gate with
that detector at every concurrency, and every clean cell (each profile a fault
names, at every concurrency, two seeds) must pass.

The configuration sweep runs the same through ``--engine-set``, on engine
settings a user can change that move which paths run (``SWEEP``: shared-prefix
waits off, another page size, speculative decoding off): every fault at
c = 1 and 8 under each setting (less the faults a setting takes the path of
away, ``NOT_REACHED``), and the clean engine on each profile a fault names.

The cells go to ``docs/mutation-matrix.json``; ``docs/mutation-matrix.md`` is
rendered from that file alone, so the test that checks the document reads the
same cells.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from kvwatch.gate.verdicts.catches import CATCHES
from kvwatch.gate.verdicts.detectors import IDS
from kvwatch.harness.profiles import PROFILES

CONCURRENCY = (1, 2, 4, 8)
CLEAN_SEEDS = (0, 1)
# Engine settings besides the default, each as ``--engine-set`` values.
SWEEP: dict[str, tuple[str, ...]] = {
    "prefix-waits-off": ("scheduler.prefix_waits=false",),
    "page-8": ("cache.full_kv.page_size=8", "cache.swa_kv.page_size=8"),
    "spec-off": ("scheduler.spec=null",),
}
# A page size is how a pool is cut, not how big it is: under page-8 each profile's
# full.kv and swa.kv pools get twice the pages, so they hold the same tokens. (With
# the pages alone halved, slot-cache's pool held half the tokens, pressure cleared
# both slots before either was reused, and seed 004's stale entry never formed.)
SAME_MEMORY = {"page-8": 2}
SWEEP_CONCURRENCY = (1, 8)
# Faults whose code path a setting removes: not run under it, and why.
NOT_REACHED: dict[str, dict[str, str]] = {
    "spec-off": {"spec-overalloc-leak": "no verify step allocates drafts without speculation"},
}
# Sweep cells where the gate misses a fault, found by running them and left in the
# matrix as misses, with what is known of why: detection gaps to close, not cells to
# drop. (fault, setting, concurrency) -> why.
KNOWN_MISSES: dict[tuple[str, str, int], str] = {}
CELL_TIMEOUT_S = 3600
DOC = Path(__file__).resolve().parents[1] / "docs" / "mutation-matrix.md"


class Job(NamedTuple):
    fault: str | None  # None: the clean engine
    profile: str
    concurrency: int
    seed: int = 0
    config: str = ""  # a SWEEP key; "": the default engine

    @property
    def name(self) -> str:
        name = f"{self.fault or 'clean'}-{self.profile}-c{self.concurrency}-s{self.seed}"
        return f"{name}-{self.config}" if self.config else name

    def argv(self, out: Path) -> list[str]:
        args = ["gate", "--profile", self.profile, "-c", str(self.concurrency)]
        args += ["--seed", str(self.seed), "--out", str(out), "--no-report"]
        for setting in sweep_sets(self.config, self.profile) if self.config else ():
            args += ["--engine-set", setting]
        return args + (["--inject", self.fault] if self.fault else [])


def sweep_sets(config: str, profile: str) -> tuple[str, ...]:
    """The ``--engine-set`` values of a sweep setting for one profile: the setting's
    own, and under ``SAME_MEMORY`` the profile's paged pools scaled to hold the
    same tokens."""
    sets = SWEEP[config]
    factor = SAME_MEMORY.get(config)
    if factor is None:
        return sets
    cache = PROFILES[profile].engine_config()["cache"]
    return (
        *sets,
        *(f"cache.{g}.capacity={cache[g]['capacity'] * factor}" for g in ("full_kv", "swa_kv")),
    )


class Cell(NamedTuple):
    job: Job
    exit_code: int
    verdicts: dict[str, tuple[str, int | None]]  # detector -> (verdict, first failing turn)
    requests: int
    elapsed_s: float

    @property
    def expected(self) -> str | None:
        return CATCHES[self.job.fault].detector if self.job.fault else None

    @property
    def holds(self) -> bool:
        """A fault failed the gate (exit 1) with its detector; a clean run passed (exit 0)."""
        if self.job.fault is None:
            return self.exit_code == 0
        return self.exit_code == 1 and self.verdicts.get(self.expected, ("",))[0] == "fail"

    def to_json(self) -> dict:
        return {
            **self.job._asdict(),
            "exit_code": self.exit_code,
            "verdicts": {k: list(v) for k, v in self.verdicts.items()},
            "requests": self.requests,
            "elapsed_s": self.elapsed_s,
        }

    @classmethod
    def from_json(cls, data: dict) -> Cell:
        job = Job(
            fault=data["fault"],
            profile=data["profile"],
            concurrency=data["concurrency"],
            seed=data["seed"],
            config=data.get("config", ""),
        )
        verdicts = {k: (v[0], v[1]) for k, v in data["verdicts"].items()}
        return cls(job, data["exit_code"], verdicts, data["requests"], data["elapsed_s"])


def jobs(
    faults: Iterable[str] = CATCHES,
    concurrency: Sequence[int] = CONCURRENCY,
    clean: bool = True,
    sweep: bool = True,
) -> list[Job]:
    """Every fault at every concurrency, then the clean engine on each profile a
    fault names, at every concurrency, with each clean seed; then (``sweep``)
    the same at c = 1 and 8 under each setting of ``SWEEP``, one clean seed."""
    faults = list(faults)
    profiles = sorted({catch.profile for catch in CATCHES.values()})
    out = [
        Job(fault=f, profile=CATCHES[f].profile, concurrency=c) for f in faults for c in concurrency
    ]
    if clean:
        out += [
            Job(fault=None, profile=p, concurrency=c, seed=s)
            for p in profiles
            for c in concurrency
            for s in CLEAN_SEEDS
        ]
    for config in SWEEP if sweep else ():
        left_out = NOT_REACHED.get(config, {})
        out += [
            Job(fault=f, profile=CATCHES[f].profile, concurrency=c, config=config)
            for f in faults
            if f not in left_out
            for c in SWEEP_CONCURRENCY
        ]
        if clean:
            out += [
                Job(fault=None, profile=p, concurrency=c, config=config)
                for p in profiles
                for c in SWEEP_CONCURRENCY
            ]
    return out


def run_cell(job: Job, root: Path, extra: Sequence[str] = ()) -> Cell:
    """One ``kvwatch gate`` process (``extra``: more gate flags); its outputs stay
    in ``root/job.name``."""
    out = root / job.name
    shutil.rmtree(out, ignore_errors=True)
    started = time.monotonic()
    cmd = [sys.executable, "-m", "kvwatch", *job.argv(out), *extra]
    log = root / f"{job.name}.log"
    with log.open("w") as sink:
        proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, timeout=CELL_TIMEOUT_S)
    elapsed = round(time.monotonic() - started, 1)
    summary_path = out / "summary.json"
    if not summary_path.exists():
        return Cell(job=job, exit_code=proc.returncode, verdicts={}, requests=0, elapsed_s=elapsed)
    run = json.loads(summary_path.read_text())["runs"][0]
    verdicts = {k: (v["verdict"], v["first_turn"]) for k, v in run["detectors"].items()}
    return Cell(
        job=job,
        exit_code=proc.returncode,
        verdicts=verdicts,
        requests=run["requests"],
        elapsed_s=elapsed,
    )


def run_matrix(
    job_list: Sequence[Job],
    root: Path,
    workers: int = 2,
    progress: Callable[[str], None] | None = None,
) -> list[Cell]:
    """The cells in ``job_list`` order; the busiest (c = 8) start first. Progress
    lines go to stdout as cells end (flushed: `make matrix` is often piped)."""
    progress = progress or functools.partial(print, flush=True)
    root.mkdir(parents=True, exist_ok=True)
    order = sorted(job_list, key=lambda j: -j.concurrency)
    done: dict[Job, Cell] = {}

    def one(job: Job) -> None:
        cell = run_cell(job, root)
        done[job] = cell
        mark = "ok" if cell.holds else f"WRONG (exit {cell.exit_code})"
        progress(f"[{len(done)}/{len(order)}] {job.name}: {mark} ({cell.elapsed_s} s)")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, order))
    return [done[j] for j in job_list]


def problems(cells: Sequence[Cell]) -> list[str]:
    """What the cells fail to show: a fault not caught by its detector, a clean run
    that did not pass, a fault or concurrency with no cell."""
    out = []
    for cell in cells:
        job = cell.job
        if not cell.holds and (job.fault, job.config, job.concurrency) not in KNOWN_MISSES:
            failed = [d for d, (v, _) in cell.verdicts.items() if v == "fail"]
            what = f"expected {cell.expected} to fail" if cell.expected else "expected a pass"
            out.append(f"{cell.job.name}: exit {cell.exit_code}, failed {failed}; {what}")
    covered = {(c.job.fault, c.job.concurrency, c.job.config) for c in cells}
    out += [
        f"{f} at c={c}: no cell" for f in CATCHES for c in CONCURRENCY if (f, c, "") not in covered
    ]
    out += [
        f"{f} at c={c} under {config}: no cell"
        for config in SWEEP
        for f in CATCHES
        if f not in NOT_REACHED.get(config, {})
        for c in SWEEP_CONCURRENCY
        if (f, c, config) not in covered
    ]
    return out


def render(cells: Sequence[Cell]) -> str:
    """Markdown: one row per cell, the first failing turn of each detector the
    cells ran (a detector added since the cells were run has no column yet)."""
    ran = {name for cell in cells for name in cell.verdicts}
    ids = [name for name in IDS if name in ran]
    lines = [
        "# Mutation matrix",
        "",
        "Generated by `make matrix` (`python -m mutation.matrix`) from",
        "`docs/mutation-matrix.json`, and checked by `tests/mutation/test_mutation_matrix.py`.",
        "Each row is one `kvwatch gate --profile P -c C --seed S [--inject FAULT]",
        "[--engine-set KEY=VALUE]...` run on a",
        "fresh server. A cell is the first turn (0-based) at which that detector failed:",
        "`-` passed, `s` skipped (the heap detector runs on profiles that trace the heap).",
        "The detector that must catch the fault is **bold**; every fault row must exit 1",
        "and every clean row exit 0. `sent`: requests the users sent. The check after",
        "the last turn (sessions closed, cache drained and flushed) is turn 6, turn 8",
        "in rl-rollout (its own number of turns).",
        "Every engine runs with the gate's failpoints (seeded with S), armed at c >= 2;",
        "a run at c = 1 runs the load as written.",
        "",
        "`engine`: `default`, or a setting of the configuration sweep, passed as",
        "`--engine-set` values:",
        "",
        *(f"- `{name}`: `{' '.join(sets)}`" for name, sets in SWEEP.items()),
        *(
            f"- under `{name}`, each profile's full.kv and swa.kv capacities times {k}: "
            "pages that hold fewer tokens come more of them, the same memory"
            for name, k in SAME_MEMORY.items()
        ),
        *(
            f"- not run under `{config}`: {fault} ({why})"
            for config, faults in NOT_REACHED.items()
            for fault, why in faults.items()
        ),
        *(
            f"- missed under `{config}` at c = {c}: {fault} ({why})"
            for (fault, config, c), why in KNOWN_MISSES.items()
        ),
        "",
        *_tally(cells),
        "",
        "| fault | profile | engine | c | seed | exit | sent | " + " | ".join(ids) + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(ids),
    ]
    for cell in cells:
        marks = []
        for name in ids:
            verdict, turn = cell.verdicts.get(name, ("skipped", None))
            mark = str(turn) if verdict == "fail" else ("s" if verdict == "skipped" else "-")
            marks.append(f"**{mark}**" if name == cell.expected else mark)
        job = cell.job
        lines.append(
            f"| {job.fault or '(clean)'} | {job.profile} | {job.config or 'default'} "
            f"| {job.concurrency} | {job.seed} "
            f"| {cell.exit_code} | {cell.requests} | " + " | ".join(marks) + " |"
        )
    return "\n".join(lines) + "\n"


def _tally(cells: Sequence[Cell]) -> list[str]:
    """One line per engine: faults caught of fault cells, clean runs passed."""
    out = []
    for config in ("", *SWEEP):
        mine = [c for c in cells if c.job.config == config]
        faults = [c for c in mine if c.job.fault]
        clean = [c for c in mine if not c.job.fault]
        if mine:
            out.append(
                f"- `{config or 'default'}`: {sum(c.holds for c in faults)} of {len(faults)} "
                f"fault cells caught by their detector, {sum(c.holds for c in clean)} of "
                f"{len(clean)} clean cells passed"
            )
    return out


def load(path: Path) -> list[Cell]:
    return [Cell.from_json(c) for c in json.loads(path.read_text())["cells"]]


def save(cells: Sequence[Cell], doc: Path) -> Path:
    """``doc`` (markdown) and its cells beside it (``.json``)."""
    cells_path = doc.with_suffix(".json")
    cells_path.write_text(json.dumps({"cells": [c.to_json() for c in cells]}, indent=1) + "\n")
    doc.write_text(render(cells))
    return cells_path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOC, help="default: docs/mutation-matrix.md")
    parser.add_argument("--runs", type=Path, default=Path("kvwatch-out/matrix"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--fault",
        action="append",
        choices=sorted(CATCHES),
        help="rerun only these faults' cells and keep the other cells of --out",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        action="append",
        help="rerun only the cells at this concurrency and keep the other cells of --out",
    )
    parser.add_argument(
        "--profile",
        action="append",
        help="rerun only the cells of this profile and keep the other cells of --out",
    )
    parser.add_argument(
        "--config",
        action="append",
        choices=["default", *SWEEP],
        help="rerun only the cells of this engine (default or a sweep setting) and keep "
        "the other cells of --out",
    )
    parser.add_argument(
        "--no-sweep", action="store_true", help="leave out the configuration sweep's cells"
    )
    args = parser.parse_args(argv)
    todo = jobs(args.fault or CATCHES, clean=not args.fault, sweep=not args.no_sweep)
    if args.concurrency:
        todo = [j for j in todo if j.concurrency in args.concurrency]
    if args.profile:
        todo = [j for j in todo if j.profile in args.profile]
    if args.config:
        todo = [j for j in todo if (j.config or "default") in args.config]
    cells = run_matrix(todo, args.runs, args.workers)
    if args.fault or args.concurrency or args.profile or args.config:
        fresh = {c.job: c for c in cells}
        cells = [fresh.get(c.job, c) for c in load(args.out.with_suffix(".json"))]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(cells, args.out)
    wrong = problems(cells)
    print(f"wrote {args.out}: {len(cells)} cells, {len(wrong)} wrong")
    for line in wrong:
        print(f"  {line}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
