"""The one runner of every hunt: its units of work, ``jobs`` at a time, then its two files.

A hunt is a ``Plan``: the units of its matrix in order (a gate process per
build and seed, ``gates.py``; a batch of runs in one vLLM driver process,
``driver_runs.py``), how one unit runs into rows, the progress line a unit
prints, and how the rows read as markdown. Per engine, only the matrix
differs (``sglang.py``, ``lightllm.py``, ``vllm.py``)::

    execute(plan, jobs)          each unit's rows, ``jobs`` units at a time, in the
                                 matrix's order whatever order they end in
    hunt(plan, args)             execute, timed; the settings are ``args`` with the
                                 wall time, the cores and the plan's own; report.write
                                 to ``args.out`` (.json, .md with the hand-written part kept)

Invariant: rows keep the matrix's order whatever ``jobs`` is; the files go
where ``args.out`` says, which the caller gives (the Makefile: ``docs/...``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hunts import report


def _flat(results: list[list[dict]]) -> list[dict]:
    return [row for rows in results for row in rows]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One hunt: what runs, and how its rows read."""

    units: Sequence[Any]  # the matrix's units of work, in order
    run: Callable[[Any], list[dict]]  # one unit -> its rows
    line: Callable[[Any, list[dict]], str]  # one unit's progress line, once it ran
    header: str  # printed before the first unit starts
    markdown: Callable[[list[dict], dict], str]  # (rows, settings) -> OUT.md above the marker
    footer: Callable[[list[dict], int], str]  # (rows, wall seconds) -> the last line
    rows: Callable[[list[list[dict]]], list[dict]] = _flat  # every unit's rows -> the table's
    settings: dict = field(default_factory=dict)  # what the plan adds to the settings


def execute(plan: Plan, jobs: int) -> list[list[dict]]:
    """Each unit's rows, ``jobs`` units at a time, in the order of ``plan.units``."""

    def one(unit: Any) -> list[dict]:
        rows = plan.run(unit)
        print(plan.line(unit, rows), flush=True)
        return rows

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, plan.units))


def hunt(plan: Plan, args: Any) -> int:
    """Run ``plan`` ``args.jobs`` units at a time and write ``args.out``.json and .md."""
    print(plan.header, flush=True)
    started = time.monotonic()
    rows = plan.rows(execute(plan, args.jobs))
    wall = round(time.monotonic() - started)
    settings = vars(args) | {"wall_s": wall, "cores": os.cpu_count()} | plan.settings
    report.write(Path(args.out), settings, rows, plan.markdown(rows, settings))
    print(plan.footer(rows, wall), flush=True)
    return 0
