"""``make vllm-history-hunt``: generated histories on vLLM's own scheduler, every setup.

    python -m hunts.vllm_histories --out docs/vllm-history-hunt
                                   [--budget-minutes 10] [--release 0.33.0] [--max-seeds 120]

Two parts, both from generated histories alone (``kvwatch histories --engine
vllm``; the scheduler in vLLM's Python, ``targets/vllm/histories.py``):

* **the newest release**: every setup of ``SETUPS`` with each plan of ``PLANS``
  (``history_sweep.sweep``), failures labelled by the live rows (``LIVE``: a bug
  upstream describes and has not fixed in a release), any other counted by its
  first finding, each shrunk and saved once.
* **fixed rows** (``FIXED``, the vLLM rows of ``docs/real-bugs.json``):
  ``history_fixes.fixed``, found on the buggy release, shrunk and saved as
  ``OUT/<row>.json``, and absent from the same seeds on the fix.

Invariant: every history is played on a fresh scheduler; a row is found only
where its ``explains`` holds for the history played.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hunts import report
from hunts.history_fixes import COMPARED, SHRINK_BUDGET, fixed, fixed_table
from hunts.history_rows import FixedRow, Row, audit_finding
from hunts.history_sweep import ROUND, newest_table, plans_line, sweep, write
from kvwatch.histories.checks import HistoryVerdict
from kvwatch.histories.generate import Plan
from kvwatch.histories.play import Played
from kvwatch.targets.vllm.histories import NEWEST, SETUPS, VllmHistoryTarget

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
    """Every setup x plan on ``release`` (``history_sweep.sweep``)."""
    targets = [VllmHistoryTarget(version=release, setup=setup) for setup in SETUPS]
    return {"release": release, **sweep(targets, PLANS, LIVE, budget_s, max_seeds, out, say)}


def markdown(settings: dict[str, Any], swept: dict[str, Any], fixes: list[dict]) -> str:
    newest_lines = newest_table(swept)
    fixed_lines = fixed_table(fixes)
    plans = plans_line(PLANS)
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
    return write(args.out, settings, swept, fixes, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
