"""``make vllm-history-hunt``: generated histories on vLLM's own scheduler, every setup.

    python -m hunts.vllm_histories --out docs/vllm-history-hunt
                                   [--budget-minutes 10] [--release 0.33.0] [--max-seeds 120]

Two parts, both from generated histories alone (``kvwatch histories --engine
vllm``; the scheduler in vLLM's Python, ``targets/vllm/histories.py``):

* **the newest release**: every setup of ``SETUPS`` with each plan of ``PLANS``
  takes turns, ``ROUND`` seeds at a time, until the budget is spent or each
  lane played ``--max-seeds``. A failing history is shrunk while it shows its
  first finding (``HistoryVerdict.primary``) and saved as
  ``OUT/<setup>-<seed>.json``, once per distinct first finding; failures are
  counted by that finding, with the first seed that shows each: candidates,
  not called bugs until read and searched upstream.
* **fixed rows** (``FIXED``, the vLLM rows of ``docs/real-bugs.json`` that a
  history without sessions reaches): ``history_fixes.fixed``, found on the
  buggy release, shrunk and saved as ``OUT/<row>.json``, and absent from the
  same seeds on the fix.

Invariant: every history is played on a fresh scheduler; a row is found only
where its ``explains`` holds for the history played.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hunts import report
from hunts.history_fixes import COMPARED, SHRINK_BUDGET, fixed
from hunts.history_rows import FixedRow, Row, audit_finding
from kvwatch.histories.checks import HistoryVerdict, signature
from kvwatch.histories.generate import Plan, generate
from kvwatch.histories.hunt import run_history, save_history
from kvwatch.histories.play import Played
from kvwatch.histories.shrink import shrink
from kvwatch.targets.vllm.histories import NEWEST, SETUPS, VllmHistoryTarget

ROUND = 20  # seeds per lane per turn
PLANS = {
    "spread": Plan(turns=4, ops_per_turn=12),
    "dense": Plan(turns=3, ops_per_turn=20, spread=6),  # more arrivals at once: pressure
}


def pr_49206(played: Played, verdict: HistoryVerdict) -> str | None:
    """Priority scheduling preempts the lowest-priority running request and skips the
    running request after it, with budget left (fixed in 0.28.0)."""
    detail = audit_finding(verdict, "starved", "running-skipped", "preempted this step: ")
    return None if detail is None or "preempted this step: none" in detail else detail


def pr_44490(played: Played, verdict: HistoryVerdict) -> str | None:
    """A full-attention group's ``new_block_ids`` is never cleared (fixed in 0.26.0)."""
    return audit_finding(verdict, "registry", "new_block_ids")


def _row(row: str, setup: str, explains: Callable, buggy: str, fixed_in: str) -> FixedRow:
    return FixedRow(Row(row, (setup,), explains, PLANS["spread"]), buggy, fixed_in)


FIXED = (
    _row("vllm-pr-49206", "priority", pr_49206, "0.27.1", "0.28.0"),
    _row("vllm-pr-44490", "plain", pr_44490, "0.25.1", "0.26.0"),
)


def newest(
    release: str, budget_s: float, max_seeds: int, out: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    """Every setup x plan on ``release``, ``ROUND`` seeds a lane in turn; each distinct
    first finding shrunk and saved once."""
    played_n: Counter[str] = Counter()
    failed_n: Counter[str] = Counter()
    found: dict[str, dict[str, Any]] = {}
    targets = [VllmHistoryTarget(version=release, setup=setup) for setup in SETUPS]
    start, seed0 = time.perf_counter(), 0
    with contextlib.ExitStack() as stack:
        for target in targets:  # a driver process each, vLLM imported once in each
            stack.enter_context(target.opened())
        while seed0 < max_seeds and time.perf_counter() - start < budget_s:
            for target, (name, plan) in itertools.product(targets, PLANS.items()):
                lane = f"{target.setup} ({name})"
                for seed in range(seed0, min(seed0 + ROUND, max_seeds)):
                    _, verdict = run_history(target, generate(target.shape, seed, plan))
                    played_n[lane] += 1
                    if not verdict.findings:
                        continue
                    failed_n[lane] += 1
                    sig = verdict.primary or ""
                    if sig in found:
                        found[sig]["count"] += 1
                        continue
                    found[sig] = _saved(target, lane, seed, plan, sig, out)
                    say(f"{lane} seed {seed}: {sig} -> {found[sig]['saved']}")
            seed0 += ROUND
    return {
        "release": release,
        "seconds": round(time.perf_counter() - start, 1),
        "histories": dict(played_n),
        "failed": dict(failed_n),
        "findings": sorted(found.values(), key=lambda e: -e["count"]),
    }


def _saved(
    target: VllmHistoryTarget, lane: str, seed: int, plan: Plan, sig: str, out: Path
) -> dict[str, Any]:
    """The history of ``seed`` shrunk while it shows ``sig``, saved beside the doc."""
    history = generate(target.shape, seed, plan)

    def shows(h) -> bool:
        return run_history(target, h)[1].shows(sig)

    small, plays = shrink(history, shows, SHRINK_BUDGET)
    _, verdict = run_history(target, small)
    path = out / f"{target.setup}-{seed}.json"
    save_history(path, target, seed, small, verdict, lane=lane)
    first = next((f for f in verdict.findings if signature(f) == sig), verdict.findings[0])
    return {
        "signature": sig, "count": 1, "lane": lane, "seed": seed,
        "operations": len(history.ops), "shrunk_operations": len(small.ops), "plays": plays,
        "detail": first.detail, "saved": path.name,
    }  # fmt: skip


def markdown(settings: dict[str, Any], swept: dict[str, Any], fixes: list[dict]) -> str:
    c = report.cell
    played = ", ".join(
        f"{lane}: {n} ({swept['failed'].get(lane, 0)} failed)"
        for lane, n in swept["histories"].items()
    )
    newest_lines = [
        f"Histories played: {played}, in {swept['seconds']} s.",
        "",
        "| first finding | histories | first seen | shrunk to | saved | detail |",
        "|---|---|---|---|---|---|",
        *(
            f"| {c(f['signature'])} | {f['count']} | {f['lane']} seed {f['seed']} | "
            f"{f['shrunk_operations']} | `{f['saved']}` | {c(f['detail'][:240])} |"
            for f in swept["findings"]
        ),
    ]
    if not swept["findings"]:
        newest_lines.append("| none | | | | | |")
    fixed_lines = [
        "| row | setup | buggy | first seed | shrunk to | fixed | seeds compared | "
        "show it on the buggy | on the fix | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| `{r['row']}` | {r['setup']} | {r['buggy']} | {r['found_at_seed']} | "
            f"{r['shrunk_operations']} | {r['fixed']} | {r['seeds_compared']} | "
            f"{r['shown_on_buggy']} | {len(r['shown_on_fix'])} | {r['verdict']} |"
            for r in fixes
        ),
        "",
        'On the fix, the shrunk history is played too (it counts in "on the fix").',
    ]
    plans = "; ".join(
        f"{name}: {p.turns} turns of {p.ops_per_turn} operations over {p.spread} steps"
        for name, p in PLANS.items()
    )
    return report.document(
        "vLLM history hunt",
        [
            "Generated client histories on vLLM's own scheduler in vLLM's Python (`kvwatch "
            "histories --engine vllm`, `targets/vllm/histories.py`): every setup on the newest "
            "release, and the fixed corpus rows a history without sessions reaches, found on "
            "the release with the bug and not on the fix. Saved histories replay with "
            "`kvwatch histories --replay docs/vllm-history-hunt/<file>`. Written by `make "
            "vllm-history-hunt` (`hunts/vllm_histories.py`).",
        ],
        f"Settings: a budget of {settings['budget_minutes']:g} minutes and at most "
        f"{settings['max_seeds']} seeds per lane on the newest release, {ROUND} seeds per "
        f"lane in turn; plans: {plans}; fixed rows searched over at most "
        f"{settings['max_seeds']} seeds and compared over at least {COMPARED}; shrinking "
        f"spends at most {SHRINK_BUDGET} plays.",
        [
            (f"Every setup on {swept['release']}", newest_lines),
            ("Fixed rows: found on the buggy release, not on the fix", fixed_lines),
        ],
    )


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hunts.vllm_histories")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--release", default=NEWEST)
    parser.add_argument("--budget-minutes", type=float, default=10.0)
    parser.add_argument("--max-seeds", type=int, default=120)
    args = parser.parse_args(list(argv) if argv is not None else None)
    say = print
    swept = newest(args.release, args.budget_minutes * 60, args.max_seeds, args.out, say)
    fixes = fixed(FIXED, VllmHistoryTarget, args.max_seeds, args.out, say)
    settings = {"budget_minutes": args.budget_minutes, "max_seeds": args.max_seeds}
    rows = [{"part": "newest", **f} for f in swept["findings"]]
    rows += [{"part": "fixed", **r} for r in fixes]
    report.write(args.out, {**settings, "newest": swept}, rows, markdown(settings, swept, fixes))
    return 0 if all(r["verdict"] == "re-found" for r in fixes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
