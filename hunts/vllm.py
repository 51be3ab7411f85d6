"""``make vllm-hunt``: vLLM's scheduler under every layout and option, with every check on.

    python -m hunts.vllm --out docs/vllm-hunt [--releases 0.32.0 0.33.0] [--seeds 3]
                         [--steps 150] [--turns 4] [-c 4] [--jobs 2]

The matrix (each case one run of vLLM's scheduler in its driver process,
``driver_runs.py``; ``runner.py`` runs them and writes ``OUT.json`` and
``OUT.md``, ``driver_tables.py`` the tables):

    releases × layouts (``LAYOUTS``) × options (``SCHEDS``) × profiles × seeds

``mixed`` (``kvwatch.targets.vllm.mixed_load``: seeded, ``--steps`` steps of
arrivals, aborts and streamed chunks a turn) runs in every layout under every
option and seed; ``waves``, ``streaming-input`` and ``priority`` run once per
layout under their own options; the layout profiles
(``kvwatch.targets.vllm.layout_workloads``) once each, in their own layout.

Invariant: the matrix's order is the table's; ``--out`` is the caller's.
"""

from __future__ import annotations

import argparse
import os

from hunts import driver_runs, runner
from hunts.driver_runs import Case
from kvwatch.targets.vllm.kv_layout import parse
from kvwatch.targets.vllm.release import find
from kvwatch.targets.vllm.sched_profiles import WORKLOADS

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


def matrix(releases: list[str], seeds: int) -> list[Case]:
    """Every case of the hunt, in a stable order."""
    cases = []
    for release in releases:
        for layout in LAYOUTS:
            for sched, opts in SCHEDS.items():
                cases += [
                    Case(
                        release=release,
                        profile="mixed",
                        layout=layout,
                        sched=sched,
                        seed=s,
                        options=opts,
                    )
                    for s in range(seeds)
                ]
            cases += [
                Case(release=release, profile=p, layout=layout, sched=None, seed=0) for p in FIXED
            ]
        own = [p for p in WORKLOADS if p not in FIXED and p != "mixed"]
        cases += [Case(release=release, profile=p, layout=None, sched=None, seed=0) for p in own]
    return cases


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
    ap.add_argument("--out", required=True, help="OUT.json and OUT.md (make: docs/vllm-hunt)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    releases = {v: find(v, args.vllm_python) for v in args.releases}
    cases = matrix(args.releases, args.seeds)
    return runner.hunt(driver_runs.plan(cases, releases, args), args)


if __name__ == "__main__":
    raise SystemExit(main())
