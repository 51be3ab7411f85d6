"""``make lightllm-history-hunt``: generated histories on LightLLM's own infer loop.

    python -m hunts.lightllm_histories --out docs/lightllm-history-hunt
                                       [--lightllm-repo REPO] [--newest COMMIT]
                                       [--budget-minutes 4] [--max-seeds 300]

LightLLM is not on PyPI: its commits come from a git repository
(``--lightllm-repo``, default ``$KVWATCH_LIGHTLLM_REPO``), each exported once
under ``--work`` (``checkout_check.export``). Two parts, both from generated
histories alone (``kvwatch histories --engine lightllm``,
``targets/lightllm/histories.py``):

* **the newest commit** (``--newest``, default the repository's ``HEAD``):
  every setup of ``SETUPS`` with each plan of ``PLANS``
  (``history_sweep.sweep``); LightLLM has no live row, so every failure is
  counted by its first finding, shrunk and saved once: a candidate;
* **fixed rows** (``FIXED``, the LightLLM row of ``docs/real-bugs.json``):
  ``history_fixes.fixed``, found on the commit with the bug, shrunk and saved
  as ``OUT/<row>.json``, and absent from the same seeds on the fix.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hunts import report
from hunts.history_fixes import COMPARED, SHRINK_BUDGET, fixed, fixed_table
from hunts.history_rows import FixedRow, Row, audit_finding
from hunts.history_sweep import ROUND, newest_table, plans_line, sweep, write
from kvwatch.histories.checks import RAISED, HistoryVerdict
from kvwatch.histories.generate import Plan
from kvwatch.histories.play import Played
from kvwatch.targets.lightllm.checkout_check import export
from kvwatch.targets.lightllm.histories import SETUPS, LightllmHistoryTarget

REPO_ENV = "KVWATCH_LIGHTLLM_REPO"
PLANS = {
    "spread": Plan(turns=4, ops_per_turn=12),
    "dense": Plan(turns=3, ops_per_turn=20, spread=6),  # more arrivals at once: pauses
}


def pr_1348(played: Played, verdict: HistoryVerdict) -> str | None:
    """A request aborted or paused mid chunked prefill keeps the big-page state buffers it
    took at each boundary: ``free_a_req_mem``'s assert stops the loop, or, with asserts
    off, the buffers stay allocated with no holder; and the root goes into the eviction set
    once the tree empties (both fixed by LightLLM's b0231dea)."""
    cut = [
        rid
        for rid, trail in played.stages.items()
        if "prefilling" in trail and ("paused" in trail or rid in played.aborted_in)
    ]
    for f in verdict.findings:
        if f.check == RAISED and "free_a_req_mem" in f.detail and cut:
            return f"{f.detail}; cut mid-prefill (aborted or paused): {', '.join(cut)}"
    return audit_finding(verdict, "tree", "root is in _evict_tree_set")


FIXED = (
    FixedRow(
        row=Row(id="lightllm-pr-1348", setups=("linear",), explains=pr_1348, plan=PLANS["spread"]),
        buggy="3a15cb096120",
        fixed="b0231dea85d9",
    ),
)


def maker(repo: Path, work: Path) -> Callable[..., LightllmHistoryTarget]:
    """``make(version=COMMIT, setup=NAME)``: the commit exported once, as a history target."""

    def make(version: str, setup: str) -> LightllmHistoryTarget:
        return LightllmHistoryTarget(src=export(repo, version, work), setup=setup)

    return make


def head_of(repo: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def markdown(settings: dict[str, Any], swept: dict[str, Any], fixes: list[dict]) -> str:
    return report.document(
        "LightLLM history hunt",
        [
            "Generated client histories on LightLLM's own infer loop, imported unmodified from "
            "a checkout and run on CPU in a process of its own (`kvwatch histories --engine "
            "lightllm`, `targets/lightllm/histories.py`): every setup on the newest commit, "
            "and the fixed corpus row, found on the commit with the bug and not on the fix. "
            "Saved histories replay with `kvwatch histories --replay "
            "docs/lightllm-history-hunt/<file> --lightllm-src DIR`, DIR a checkout of the "
            "commit the file names. Written by `make lightllm-history-hunt` "
            "(`hunts/lightllm_histories.py`).",
        ],
        f"Settings: a budget of {settings['budget_minutes']:g} minutes and at most "
        f"{settings['max_seeds']} seeds per lane on the newest commit, {ROUND} seeds per lane "
        f"in turn; plans: {plans_line(PLANS)}; fixed rows searched over at most "
        f"{settings['max_seeds']} seeds and compared over at least {COMPARED}; shrinking "
        f"spends at most {SHRINK_BUDGET} plays.",
        [
            (f"Every setup on {swept['commit'][:12]}", newest_table(swept)),
            ("Fixed rows: found on the commit with the bug, not on the fix", fixed_table(fixes)),
        ],
    )


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hunts.lightllm_histories")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lightllm-repo", type=Path, default=os.environ.get(REPO_ENV))
    parser.add_argument("--newest", default=None, help="a commit (default: the repo's HEAD)")
    parser.add_argument("--work", type=Path, default=Path("kvwatch-out/lightllm-checkouts"))
    parser.add_argument("--budget-minutes", type=float, default=4.0)
    parser.add_argument("--max-seeds", type=int, default=300)
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.lightllm_repo is None:
        parser.error(f"give a LightLLM git repository: --lightllm-repo REPO (or ${REPO_ENV})")
    say = print
    make = maker(args.lightllm_repo.resolve(), args.work.resolve())
    commit = args.newest or head_of(args.lightllm_repo)
    targets = [make(version=commit, setup=setup) for setup in SETUPS]
    budget_s = args.budget_minutes * 60
    swept = {"commit": targets[0].checkout.commit or commit}
    swept |= sweep(targets, PLANS, (), budget_s, args.max_seeds, args.out, say)
    fixes = fixed(FIXED, make, args.max_seeds, args.out, say)
    settings = {"budget_minutes": args.budget_minutes, "max_seeds": args.max_seeds}
    return write(args.out, settings, swept, fixes, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
