"""``make vllm-hunt``: vLLM's scheduler under every layout and option, with every check on.

    python -m hunts.vllm [--releases 0.32.0 0.33.0] [--seeds 3] [--steps 150]
                                        [--turns 4] [-c 4] [--jobs 2] [--out docs/vllm-hunt]

Runs ``scheduler_driver`` (the release's Python, ``release.find``; each
driver process runs a batch of plans in turn, so vLLM is imported once a
batch, and each plan gets a fresh scheduler) over the matrix

    releases × layouts (``LAYOUTS``) × options (``SCHEDS``) × profiles × seeds

``mixed`` (``mixed_load.py``: seeded, ``--steps`` steps of arrivals, aborts
and streamed chunks a turn) runs in every layout under every option and
seed; ``waves``, ``streaming-input`` and ``priority`` run once per layout
under their own options; the layout profiles (``layout_workloads.py``) once
each, in their own layout. Each run is judged by what the driver's checks
saw: the audit, the hash checks (fine hashes included), liveness, scratch
and the event ledger, at every step and barrier. ``hunt_report.py`` writes
``OUT.json`` (one row per run) and ``OUT.md`` (coverage and findings).

Invariant: a run is a pure function of (release, layout, option, profile,
seed, steps, turns, c); a release that cannot build a layout records why
(``unsupported``), which is not a finding.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hunts.driver_tables import write
from kvwatch.targets.vllm.kv_layout import Layout, parse
from kvwatch.targets.vllm.release import Release, find
from kvwatch.targets.vllm.sched_profiles import WORKLOADS

DRIVER = "kvwatch.targets.vllm.run_driver"
LAYOUTS = tuple(
    parse(label)
    for label in (
        "full/b16/events",
        "full+swa/b16/w32/events",
        "full+mamba/b32/events",
        "full+mamba/b64/u16/events",
        "full+swa/b64/u16/w32/events",
        "full+swa+mamba/b64/u16/w32/events",
    )
)
SCHEDS = {  # the scheduler's options: policy, steps in flight, token budget a step
    "fcfs": {"policy": "fcfs", "in_flight": 1},
    "priority-async": {"policy": "priority", "in_flight": 2},
    "chunked-96": {"policy": "fcfs", "in_flight": 1, "budget": 96},
}
FIXED = ("waves", "streaming-input", "priority")  # deterministic: one seed, their own options


@dataclass(frozen=True, kw_only=True)
class Case:
    """One run of the matrix."""

    release: str
    profile: str
    layout: Layout | None  # None: the profile's own
    sched: str | None  # a key of SCHEDS; None: the profile's own
    seed: int

    @property
    def name(self) -> str:
        layout = self.layout.label if self.layout else "own layout"
        return f"{self.release} {self.profile} [{layout}] {self.sched or 'own'} seed {self.seed}"


def matrix(releases: list[str], seeds: int) -> list[Case]:
    """Every case of the hunt, in a stable order."""
    cases = []
    for release in releases:
        for layout in LAYOUTS:
            for sched in SCHEDS:
                cases += [
                    Case(release=release, profile="mixed", layout=layout, sched=sched, seed=s)
                    for s in range(seeds)
                ]
            cases += [
                Case(release=release, profile=p, layout=layout, sched=None, seed=0) for p in FIXED
            ]
        own = [p for p in WORKLOADS if p not in FIXED and p != "mixed"]
        cases += [Case(release=release, profile=p, layout=None, sched=None, seed=0) for p in own]
    return cases


def plan_for(case: Case, where: Path, *, steps: int, turns: int, c: int) -> dict:
    """The driver's plan for ``case`` (``scheduler_target.SchedulerServed.run``'s shape)."""
    return {
        "profile": case.profile,
        "concurrency": c,
        "turns": turns,
        "warmup": 0,
        "seed": case.seed,
        "steps": steps,
        "layout": case.layout.to_json() if case.layout else None,
        "sched": SCHEDS.get(case.sched) if case.sched else None,
        "record": str(where / "record.json"),
        "progress": str(where / "progress.jsonl"),
        "model": str(where / "model"),
    }


def seen(record: dict) -> tuple[Counter, dict]:
    """Each rule the run's probes showed (counted once per probe) and its first detail."""
    rules, first = Counter(), {}
    probes = [p for t in record.get("turns", ()) for p in t["probes"]]
    probes += [record["drained"]] if record.get("drained") else []
    for probe in probes:
        for f in [*probe["audit"]["findings"], *probe["checks"]]:
            rules[f["rule"]] += 1
            first.setdefault(f["rule"], f["detail"][:400])
    return rules, first


def row_of(case: Case, record: dict, error: str | None) -> dict:
    """The report's row for one run (``hunt_report.py``)."""
    rules, first = seen(record)
    error = record.get("error") or error
    return {
        "release": case.release,
        "vllm": record.get("vllm"),
        "profile": case.profile,
        "layout": record.get("layout") or (case.layout.label if case.layout else None),
        "sched": case.sched or "own",
        "seed": case.seed,
        "sizes": record.get("sizes"),
        "coverage": record.get("coverage") or {},
        "rules": dict(rules),
        "first": first,
        "unsupported": record.get("unsupported"),
        "error": None if record.get("unsupported") else (error or None),
        "wall_s": record.get("wall_s"),
    }


def run_batch(cases: list[Case], release: Release, args) -> list[dict]:
    """``cases`` in one driver process of ``release`` (vLLM imported once); their rows."""
    with tempfile.TemporaryDirectory(prefix="kvwatch-hunt-") as tmp:
        plans = []
        for i, case in enumerate(cases):
            where = Path(tmp) / str(i)
            where.mkdir()
            plan = plan_for(case, where, steps=args.steps, turns=args.turns, c=args.c)
            (where / "plan.json").write_text(json.dumps(plan))
            plans.append(where)
        env = {**os.environ, **release.env(), "VLLM_LOGGING_LEVEL": "ERROR"}
        cmd = [release.python, "-P", "-m", DRIVER, *(str(w / "plan.json") for w in plans)]
        try:
            done = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=args.timeout
            )
            tail = done.stderr[-1500:] if done.returncode else None
        except subprocess.TimeoutExpired:
            tail = f"the driver did not finish {len(cases)} runs in {args.timeout} s"
        rows = []
        for case, where in zip(cases, plans, strict=True):
            path = where / "record.json"
            record = json.loads(path.read_text()) if path.exists() else {}
            rows.append(row_of(case, record, None if record else tail or "no record"))
        return rows


def batches(cases: list[Case], jobs: int) -> list[list[Case]]:
    """Each release's cases dealt round-robin into ``jobs`` batches."""
    out = []
    for release in dict.fromkeys(c.release for c in cases):
        mine = [c for c in cases if c.release == release]
        out += [mine[i::jobs] for i in range(jobs) if mine[i::jobs]]
    return out


def hunt(args) -> list[dict]:
    python = args.vllm_python
    releases = {v: find(v, python) for v in args.releases}
    cases = matrix(args.releases, args.seeds)
    work = batches(cases, args.jobs)
    print(f"{len(cases)} runs in {len(work)} driver processes on {args.jobs} workers", flush=True)

    def one(batch: list[Case]) -> list[dict]:
        rows = run_batch(batch, releases[batch[0].release], args)
        for case, row in zip(batch, rows, strict=True):
            flag = "unsupported" if row["unsupported"] else ("ERROR" if row["error"] else "ok")
            print(f"  {case.name}: {flag} {row['rules'] or ''} {row['wall_s']} s", flush=True)
        return rows

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = dict(zip(map(id, work), pool.map(one, work), strict=True))
    by_case = {id(c): r for batch in work for c, r in zip(batch, done[id(batch)], strict=True)}
    return [by_case[id(c)] for c in cases]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    default_python = os.environ.get("KVWATCH_VLLM_PYTHON") or ".venv-vllm/bin/python"
    ap = argparse.ArgumentParser(prog="python -m hunts.vllm")
    ap.add_argument("--releases", nargs="+", default=["0.32.0", "0.33.0"])
    ap.add_argument("--vllm-python", default=default_python)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150, help="mixed: steps of arrivals a turn")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("-c", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=3600, help="seconds a driver process may run")
    ap.add_argument("--out", default="docs/vllm-hunt")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    rows = hunt(args)
    wall = round(time.monotonic() - started)
    write(Path(args.out), rows, vars(args) | {"wall_s": wall, "cores": os.cpu_count()})
    broken = sum(bool(r["error"]) for r in rows)
    found = sum(bool(r["rules"]) for r in rows)
    print(f"{len(rows)} runs in {wall} s: {found} with findings, {broken} broken; {args.out}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
