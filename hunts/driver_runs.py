"""A hunt made of driver runs: vLLM's own scheduler in its driver process, a batch of runs each.

The unit of ``make vllm-hunt`` (``vllm.py`` names the matrix). Each ``Case``
is one run of ``kvwatch.targets.vllm.run_driver`` (the plan of
``--engine vllm-scheduler``: a profile, a layout, the scheduler's options, a
seed); a batch of cases runs in one driver process of the release's Python
(``release.find``), one after another, so vLLM is imported once a batch and
each case gets a fresh scheduler. Each run is judged by what the driver's
checks saw: the audit, the hash checks (fine hashes included), liveness,
scratch and the event ledger, at every step and barrier. A row per run
(``row_of``): its release, profile, layout, option, seed, resolved sizes,
coverage counts, the rules its probes showed (counted once per probe) with the
first detail of each, why it was not run (``unsupported``) or broke
(``error``), and its wall time.

Invariant: a run is a pure function of (release, layout, option, profile,
seed, steps, turns, c); a release that cannot build a layout records why
(``unsupported``), which is not a finding; rows keep the cases' order.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hunts import driver_tables, runner
from kvwatch.targets.vllm.kv_layout import Layout
from kvwatch.targets.vllm.release import Release

DRIVER = "kvwatch.targets.vllm.run_driver"


@dataclass(frozen=True, kw_only=True)
class Case:
    """One run of the matrix."""

    release: str
    profile: str
    layout: Layout | None  # None: the profile's own
    sched: str | None  # the name of the scheduler's options; None: the profile's own
    seed: int
    options: dict | None = None  # the scheduler's options (``sched``'s); None: the profile's

    @property
    def name(self) -> str:
        layout = self.layout.label if self.layout else "own layout"
        return f"{self.release} {self.profile} [{layout}] {self.sched or 'own'} seed {self.seed}"


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
        "sched": case.options,
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
    """The report's row for one run (``driver_tables.py``)."""
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


def line(batch: list[Case], rows: list[dict]) -> str:
    """A line per case of the batch: ok, unsupported or ERROR, its rules, its seconds."""
    out = []
    for case, row in zip(batch, rows, strict=True):
        flag = "unsupported" if row["unsupported"] else ("ERROR" if row["error"] else "ok")
        out.append(f"  {case.name}: {flag} {row['rules'] or ''} {row['wall_s']} s")
    return "\n".join(out)


def plan(cases: Sequence[Case], releases: dict[str, Release], args: Any) -> runner.Plan:
    """The hunt over ``cases``: batches of them (``batches``), each run in a driver process
    of its release; the rows back in the cases' order."""
    work = batches(list(cases), args.jobs)

    def in_case_order(results: list[list[dict]]) -> list[dict]:
        by_case = {
            id(c): r
            for b, rs in zip(work, results, strict=True)
            for c, r in zip(b, rs, strict=True)
        }
        return [by_case[id(c)] for c in cases]

    def footer(rows: list[dict], wall: int) -> str:
        broken = sum(bool(r["error"]) for r in rows)
        found = sum(bool(r["rules"]) for r in rows)
        return (
            f"{len(rows)} runs in {wall} s: {found} with findings, {broken} broken; {args.out}.md"
        )

    return runner.Plan(
        units=work,
        run=lambda batch: run_batch(batch, releases[batch[0].release], args),
        line=line,
        header=f"{len(cases)} runs in {len(work)} driver processes on {args.jobs} workers",
        markdown=driver_tables.markdown,
        footer=footer,
        rows=in_case_order,
    )
