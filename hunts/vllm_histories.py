"""``make vllm-history-hunt``: generated histories on vLLM's own scheduler, every setup.

    python -m hunts.vllm_histories --out docs/vllm-history-hunt
                                   [--budget-minutes 10] [--release 0.33.0] [--max-seeds 120]

Two parts, both from generated histories alone (``kvwatch histories --engine
vllm``; the scheduler in vLLM's Python, ``targets/vllm/histories.py``):

* **the newest release**: every setup of ``SETUPS`` with each plan of ``PLANS``
  takes turns, ``ROUND`` seeds at a time, until the budget is spent or each
  lane played ``--max-seeds``. A failure a live row (``LIVE``: a bug upstream
  describes and has not fixed in a release) explains is that row's: its first
  history is shrunk while the row still explains it and saved as
  ``OUT/<row>.json``. Any other failing history is shrunk while it shows its
  first finding (``HistoryVerdict.primary``) and saved as
  ``OUT/<setup>-<seed>.json``, once per distinct first finding, and counted by
  that finding: candidates, not called bugs until read and searched upstream.
* **fixed rows** (``FIXED``, the vLLM rows of ``docs/real-bugs.json``):
  ``history_fixes.fixed``, found on the buggy release, shrunk and saved as
  ``OUT/<row>.json``, and absent from the same seeds on the fix.

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
from hunts.history_fixes import COMPARED, SHRINK_BUDGET, fixed, fixed_table
from hunts.history_rows import FixedRow, Row, audit_finding
from kvwatch.histories.checks import HistoryVerdict, signature
from kvwatch.histories.generate import Plan, generate
from kvwatch.histories.hunt import run_history, save_history
from kvwatch.histories.ops import History
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


def issue_49377(played: Played, verdict: HistoryVerdict) -> str | None:
    """A streaming session's next chunk keeps the block hashes of the token it replaced
    (fixed in 0.32.0)."""
    return audit_finding(verdict, "tree", "request-hash-stale")


def session_deadlock(played: Played, verdict: HistoryVerdict) -> str | None:
    """Streaming sessions resumed with their next chunk wait holding their blocks, nothing
    runs, and none fits: no request is ever scheduled again (open PR #49439)."""
    detail = audit_finding(verdict, "starved", "scheduler-stalled", "0 running")
    if detail is None or "waiting requests hold blocks: " not in detail:
        return None
    holders = detail.split("waiting requests hold blocks: ")[1].split(")")[0].split(", ")
    sessions = {s.session for s in played.sent.values() if s.session}
    held = [h for h in holders if h in sessions]
    return detail if len(held) >= 2 else None


# live in the newest release: found there, no fixed release yet
LIVE = (
    Row(
        id="vllm-streaming-session-deadlock",
        setups=("streaming", "streaming-async"),
        explains=session_deadlock,
    ),
)


def _row(row: str, setup: str, explains: Callable, buggy: str, fixed_in: str) -> FixedRow:
    row_ = Row(id=row, setups=(setup,), explains=explains, plan=PLANS["spread"])
    return FixedRow(row=row_, buggy=buggy, fixed=fixed_in)


FIXED = (
    _row("vllm-issue-49377", "streaming", issue_49377, "0.31.0", "0.32.0"),
    _row("vllm-pr-49206", "priority", pr_49206, "0.27.1", "0.28.0"),
    _row("vllm-pr-44490", "plain", pr_44490, "0.25.1", "0.26.0"),
)


def newest(
    release: str, budget_s: float, max_seeds: int, out: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    """Every setup x plan on ``release``, ``ROUND`` seeds a lane in turn. A failure a live
    row explains is that row's (its first history shrunk keeping the row, saved as
    ``<row>.json``); any other is counted by its first finding, each new one shrunk and
    saved once (``<setup>-<seed>.json``)."""
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
                    history = generate(target.shape, seed, plan)
                    played, verdict = run_history(target, history)
                    played_n[lane] += 1
                    if not verdict.findings:
                        continue
                    failed_n[lane] += 1
                    row = next((r for r in LIVE if r.explains(played, verdict)), None)
                    key = row.id if row is not None else verdict.primary or ""
                    if key in found:
                        found[key]["count"] += 1
                        continue
                    found[key] = _saved(target, lane, history, key, row, out)
                    found[key]["after_s"] = round(time.perf_counter() - start, 1)
                    say(f"{lane} seed {seed}: {key} -> {found[key]['saved']}")
            seed0 += ROUND
    return {
        "release": release,
        "seconds": round(time.perf_counter() - start, 1),
        "histories": dict(played_n),
        "failed": dict(failed_n),
        "findings": sorted(found.values(), key=lambda e: -e["count"]),
        "missed": [r.id for r in LIVE if r.id not in found],
    }


def _saved(
    target: VllmHistoryTarget, lane: str, history: History, key: str, row: Row | None, out: Path
) -> dict[str, Any]:
    """``history`` shrunk while it shows ``key`` (the live row ``row``, or a first finding),
    saved beside the doc."""

    def shows(h: History) -> bool:
        played, verdict = run_history(target, h)
        return row.explains(played, verdict) is not None if row else verdict.shows(key)

    small, plays = shrink(history, shows, SHRINK_BUDGET)
    played, verdict = run_history(target, small)
    path = out / (f"{row.id}.json" if row else f"{target.setup}-{history.seed}.json")
    evidence = (row.explains(played, verdict) if row else None) or next(
        (f.detail for f in verdict.findings if signature(f) == key), verdict.findings[0].detail
    )
    extra = {"row": row.id, "evidence": evidence} if row else {"lane": lane}
    save_history(path, target, history.seed, small, verdict, **extra)
    return {
        "row": row.id if row else None, "signature": key, "count": 1, "lane": lane,
        "seed": history.seed, "operations": len(history.ops), "shrunk_operations": len(small.ops),
        "plays": plays, "detail": evidence, "saved": path.name,
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
        "| row, or first finding | histories | first seen | found after | shrunk to | saved "
        "| evidence |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {'`' + f['row'] + '`' if f['row'] else c(f['signature'])} | {f['count']} | "
            f"{f['lane']} seed {f['seed']} | {f['after_s']} s | {f['shrunk_operations']} | "
            f"`{f['saved']}` | {c(f['detail'][:300])} |"
            for f in swept["findings"]
        ),
        *(f"| `{r}` | 0 | not found | | | | |" for r in swept["missed"]),
    ]
    if not swept["findings"] and not swept["missed"]:
        newest_lines.append("| none | | | | | | |")
    fixed_lines = fixed_table(fixes)
    plans = "; ".join(
        f"{name}: {p.turns} turns of {p.ops_per_turn} operations over {p.spread} steps"
        for name, p in PLANS.items()
    )
    return report.document(
        "vLLM history hunt",
        [
            "Generated client histories on vLLM's own scheduler in vLLM's Python (`kvwatch "
            "histories --engine vllm`, `targets/vllm/histories.py`): every setup on the newest "
            "release, each failure labelled by the live row that explains it, and the fixed "
            "corpus rows, found on the release with the bug and not on the fix. Saved histories replay with "
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
