"""A history hunt's sweep of the newest release, for an engine run apart: every setup × plan.

``sweep(targets, plans, live, ...)`` plays ``targets`` (one ``HistoryTarget``
a setup, all opened at once: a driver process each) with every plan of
``plans`` in turn, ``ROUND`` seeds a lane at a time, until the budget is
spent or each lane played ``max_seeds``. A failure a live row (``live``: a
bug upstream describes and has not fixed) explains is that row's: its first
history is shrunk while the row still explains it and saved as
``OUT/<row>.json``. Any other failing history is shrunk while it shows its
first finding (``HistoryVerdict.primary``) and saved as
``OUT/<setup>-<seed>.json``, once per distinct first finding, and counted by
it: candidates, not called bugs until read and searched upstream.
``newest_table`` is that part of a hunt's doc, ``write`` the hunt's report. ``vllm_histories.py`` and
``lightllm_histories.py`` both run it.

Invariant: every history is played on a fresh engine; a row is found only
where its ``explains`` holds for the history played.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hunts import report
from hunts.history_fixes import SHRINK_BUDGET
from hunts.history_rows import Row
from kvwatch.histories.checks import signature
from kvwatch.histories.generate import Plan, generate
from kvwatch.histories.hunt import run_history, save_history
from kvwatch.histories.ops import History
from kvwatch.histories.shrink import shrink
from kvwatch.targets.driver.history_target import HistoryTarget

ROUND = 20  # seeds per lane per turn


def sweep(
    targets: Sequence[HistoryTarget],
    plans: Mapping[str, Plan],
    live: Sequence[Row],
    budget_s: float,
    max_seeds: int,
    out: Path,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Every target (a setup each: its ``setup`` attribute) x plan, ``ROUND`` seeds a lane
    in turn; failures labelled by the live row that explains them, or counted by their
    first finding, each new one shrunk and saved once."""
    played_n: Counter[str] = Counter()
    failed_n: Counter[str] = Counter()
    found: dict[str, dict[str, Any]] = {}
    start, seed0 = time.perf_counter(), 0
    with contextlib.ExitStack() as stack:
        for target in targets:  # a driver process each, the engine imported once in each
            stack.enter_context(target.opened())
        while seed0 < max_seeds and time.perf_counter() - start < budget_s:
            for target, (name, plan) in itertools.product(targets, plans.items()):
                lane = f"{target.setup} ({name})"
                for seed in range(seed0, min(seed0 + ROUND, max_seeds)):
                    history = generate(target.shape, seed, plan)
                    played, verdict = run_history(target, history)
                    played_n[lane] += 1
                    if not verdict.findings:
                        continue
                    failed_n[lane] += 1
                    row = next((r for r in live if r.explains(played, verdict)), None)
                    key = row.id if row is not None else verdict.primary or ""
                    if key in found:
                        found[key]["count"] += 1
                        continue
                    found[key] = _saved(target, lane, history, key, row, out)
                    found[key]["after_s"] = round(time.perf_counter() - start, 1)
                    say(f"{lane} seed {seed}: {key} -> {found[key]['saved']}")
            seed0 += ROUND
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "histories": dict(played_n),
        "failed": dict(failed_n),
        "findings": sorted(found.values(), key=lambda e: -e["count"]),
        "missed": [r.id for r in live if r.id not in found],
    }


def _saved(
    target: HistoryTarget, lane: str, history: History, key: str, row: Row | None, out: Path
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


def newest_table(swept: dict[str, Any]) -> list[str]:
    """``sweep``'s result as the lines of a hunt doc's section."""
    c = report.cell
    played = ", ".join(
        f"{lane}: {n} ({swept['failed'].get(lane, 0)} failed)"
        for lane, n in swept["histories"].items()
    )
    lines = [
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
        lines.append("| none | | | | | | |")
    return lines


def write(
    out: Path,
    settings: dict[str, Any],
    swept: dict[str, Any],
    fixes: list[dict[str, Any]],
    markdown: Callable[[dict[str, Any], dict[str, Any], list[dict]], str],
) -> int:
    """A history hunt's report (``report.write``: the settings with the sweep, a row per
    finding and per fixed row, the doc); exit 0 when every fixed row was re-found."""
    rows = [{"part": "newest", **f} for f in swept["findings"]]
    rows += [{"part": "fixed", **r} for r in fixes]
    report.write(out, {**settings, "newest": swept}, rows, markdown(settings, swept, fixes))
    return 0 if all(r["verdict"] == "re-found" for r in fixes) else 1


def plans_line(plans: Mapping[str, Plan]) -> str:
    return "; ".join(
        f"{name}: {p.turns} turns of {p.ops_per_turn} operations over {p.spread} steps"
        for name, p in plans.items()
    )
