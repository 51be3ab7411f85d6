"""``make sglang-history-hunt``: generated histories on SGLang's own scheduler, labelled by
the corpus row that explains each failure, one shrunk history saved per row.

    python -m hunts.sglang_histories --out docs/sglang-history-hunt
                                     [--budget-minutes 30] [--release 0.5.23] [--max-seeds 40]

Two parts, both from generated histories alone (no row's script is run):

* **live rows** (``history_rows.LIVE``) on the newest release: the setups that
  reach them (``targets/sglang/histories.py``) take turns, ten seeds at a time,
  until every live row is found or the budget is spent. The first history a
  row explains is shrunk, keeping that row's shape (``Row.explains`` of the
  smaller history), and saved as ``OUT/<row>.json`` (``kvwatch histories
  --replay`` plays it). Failures no row explains are counted by their first
  finding, with the first seed that shows each: candidates, not called bugs.
* **fixed rows** (``history_rows.FIXED``): the row's setup on its buggy release,
  seeds from 0 until one shows the row (at most ``--max-seeds``); that history
  is shrunk and saved; then the same seeds (at least ``COMPARED``) are played
  on both releases, counted where they show the row, and the shrunk history on
  the fixed release too: re-found when some show it on the buggy release and
  none on the fix.

Each row is hunted with its own plan (``Row.plan``): for most, next turns wait
for the previous answer and no two turns of a session share a step, which
keeps two shapes other rows and upstream threads already describe
(``docs/sglang-hunt.md``) out of the way; the take crash is hunted with the
default plan, which sends next turns while the previous one runs.

Invariant: a row is found only where its ``explains`` holds for the history
played, and its saved history is one on which it still holds.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hunts import report
from hunts.history_fixes import COMPARED, SHRINK_BUDGET, fixed, fixed_table, save, shrunk
from hunts.history_rows import FIXED, LIVE
from kvwatch.histories.generate import Plan, generate
from kvwatch.histories.hunt import run_history
from kvwatch.targets.sglang.histories import SglangHistoryTarget

ROUND = 10  # seeds per setup per turn of the live part


def live(release: str, budget_s: float, out: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """The live rows on ``release``: lanes (a setup and a plan) in turns until each row
    is found or time is up."""
    lanes = sorted({(s, row.plan) for row in LIVE for s in row.setups}, key=str)
    targets = {s: SglangHistoryTarget(version=release, setup=s) for s, _ in lanes}
    found: dict[str, dict[str, Any]] = {}
    played_n: Counter[str] = Counter()
    failed_n: Counter[str] = Counter()
    others: dict[str, dict[str, Any]] = {}  # unexplained, by first finding
    start, seed0 = time.perf_counter(), 0
    while len(found) < len(LIVE) and time.perf_counter() - start < budget_s:
        for setup, plan in lanes:
            target, lane = targets[setup], _lane(setup, plan)
            rows_here = [r for r in LIVE if setup in r.setups and r.plan == plan]
            if all(r.id in found for r in rows_here):
                continue
            with target.opened():
                for seed in range(seed0, seed0 + ROUND):
                    history = generate(target.shape, seed, plan)
                    played, verdict = run_history(target, history)
                    played_n[lane] += 1
                    if not verdict.findings:
                        continue
                    failed_n[lane] += 1
                    rows = [r for r in rows_here if r.explains(played, verdict)]
                    for row in rows:
                        if row.id in found:
                            continue
                        small, plays = shrunk(target, history, row)
                        path, evidence, _ = save(out, target, seed, small, row)
                        found[row.id] = {
                            "row": row.id, "setup": setup, "lane": lane, "plan": _plan(plan), "seed": seed,
                            "after_s": round(time.perf_counter() - start, 1),
                            "operations": len(history.ops), "shrunk_operations": len(small.ops),
                            "plays": plays, "evidence": evidence, "saved": path.name,
                        }  # fmt: skip
                        say(f"{row.id}: {setup} seed {seed}, shrunk to {len(small.ops)} ops")
                    if not rows:
                        sig = verdict.primary or ""
                        entry = others.setdefault(sig, {"signature": sig, "count": 0})
                        entry.setdefault("first", f"{lane} seed {seed}")
                        entry["count"] += 1
        seed0 += ROUND
    return {
        "release": release,
        "seconds": round(time.perf_counter() - start, 1),
        "histories": dict(played_n),
        "failed": dict(failed_n),
        "found": [found[r.id] for r in LIVE if r.id in found],
        "missed": [r.id for r in LIVE if r.id not in found],
        "unexplained": sorted(others.values(), key=lambda e: -e["count"]),
    }


def _plan(plan: Plan) -> dict[str, Any]:
    return {"turns": plan.turns, "ops_per_turn": plan.ops_per_turn, "waits": plan.waits,
            "same_step_turns": plan.same_step_turns}  # fmt: skip


def _lane(setup: str, plan: Plan) -> str:
    """A lane's name: its setup, and how its next turns are sent."""
    how = "turns after answers" if plan.waits >= 1 else "turns while one runs"
    return f"{setup} ({how})"


def _settings_line(settings: dict[str, Any]) -> str:
    plans = {json.dumps(p, sort_keys=True) for p in settings["plans"].values()}
    described = "; ".join(
        f"{p['turns']} turns of {p['ops_per_turn']} operations, "
        + ("every next turn after its answer" if p["waits"] >= 1 else
           f"{p['waits']:.0%} of next turns after their answer")
        + ("" if p["same_step_turns"] else ", no two turns of a session at one step")
        for p in map(json.loads, sorted(plans))
    )  # fmt: skip
    return (
        f"Settings: a budget of {settings['budget_minutes']:g} minutes for the live rows, "
        f"{settings['seeds_per_round']} seeds per lane in turn; fixed rows searched over at "
        f"most {settings['max_seeds']} seeds and compared over at least {COMPARED}; shrinking "
        f"spends at most {settings['shrink_budget']} plays per row. Plans: {described} "
        "(each row's in `sglang-history-hunt.json`)."
    )


def markdown(settings: dict[str, Any], found: dict[str, Any], fixes: list[dict]) -> str:
    c = report.cell
    live_lines = [
        "| row | lane | seed | found after | operations | shrunk to | saved |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| `{f['row']}` | {f['lane']} | {f['seed']} | {f['after_s']} s | {f['operations']} "
            f"| {f['shrunk_operations']} | `{f['saved']}` |"
            for f in found["found"]
        ),
        *(f"| `{r}` | | | not found | | | |" for r in found["missed"]),
        "",
        "What each saved history shows (the row's own reading of it):",
        "",
        *(f"- `{f['row']}`: {c(f['evidence'])}" for f in found["found"]),
    ]
    played = ", ".join(f"{s}: {n} ({found['failed'].get(s, 0)} failed)"
                       for s, n in found["histories"].items())  # fmt: skip
    other_lines = [
        f"Histories played: {played}, in {found['seconds']} s.",
        "",
        "| first finding | histories | first seen |",
        "|---|---|---|",
        *(f"| {c(o['signature'])} | {o['count']} | {o['first']} |" for o in found["unexplained"]),
    ]
    fixed_lines = fixed_table(fixes)
    return report.document(
        "SGLang history hunt",
        [
            "Generated client histories on SGLang's own scheduler (`kvwatch histories --engine "
            "sglang`), each failure labelled by the corpus row whose shape it shows "
            "(`hunts/history_rows.py`), one history per row shrunk and saved beside this file "
            "(`kvwatch histories --replay docs/sglang-history-hunt/<row>.json`). Written by "
            "`make sglang-history-hunt` (`hunts/sglang_histories.py`).",
        ],
        _settings_line(settings),
        [
            (f"Live rows on {found['release']}", live_lines),
            ("Failures no row explains (candidates, not analysed)", other_lines),
            ("Fixed rows: found on the buggy release, not on the fix", fixed_lines),
        ],
    )


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hunts.sglang_histories")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--release", default="0.5.23")
    parser.add_argument("--budget-minutes", type=float, default=30.0)
    parser.add_argument("--max-seeds", type=int, default=40)
    args = parser.parse_args(list(argv) if argv is not None else None)
    say = print
    found = live(args.release, args.budget_minutes * 60, args.out, say)
    fixes = fixed(FIXED, SglangHistoryTarget, args.max_seeds, args.out, say)
    settings = {
        "plans": {row.id: _plan(row.plan) for row in (*LIVE, *(f.row for f in FIXED))},
        "budget_minutes": args.budget_minutes, "max_seeds": args.max_seeds,
        "seeds_per_round": ROUND, "shrink_budget": SHRINK_BUDGET,
    }  # fmt: skip
    rows = [{"part": "live", **f} for f in found["found"]] + [{"part": "fixed", **r} for r in fixes]
    report.write(args.out, {**settings, "live": found}, rows, markdown(settings, found, fixes))
    return 0 if not found["missed"] and all(r["verdict"] == "re-found" for r in fixes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
