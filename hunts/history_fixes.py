"""A history hunt's fixed rows, for any engine: found on the buggy release, not on the fix.

``fixed(rows, make, ...)`` takes each ``FixedRow`` (``history_rows.py``): its
setup on its buggy release (``make(version=, setup=)``, a ``HistoryTarget``),
seeds from 0 until one shows the row (at most ``max_seeds``); that history is
shrunk while the row still explains it (``shrunk``) and saved as
``OUT/<row>.json`` (``save``); then the same seeds (at least ``COMPARED``) are
played on both releases, counted where they show the row, and the shrunk
history on the fixed release too: re-found when some show it on the buggy
release and none on the fix. ``sglang_histories.py`` and ``vllm_histories.py``
both run it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hunts.history_rows import FixedRow, Row
from kvwatch.histories.checks import HistoryVerdict
from kvwatch.histories.generate import generate
from kvwatch.histories.hunt import run_history, save_history
from kvwatch.histories.ops import History
from kvwatch.histories.shrink import shrink
from kvwatch.targets.driver.history_target import HistoryTarget

COMPARED = 12  # seeds a fixed row is played with on both releases, at least
SHRINK_BUDGET = 150


def shrunk(target: HistoryTarget, history: History, row: Row) -> tuple[History, int]:
    """``history`` shrunk while ``row`` still explains it (and its plan allows it)."""

    def shows(h: History) -> bool:
        return row.plan.allows(h) and row.explains(*run_history(target, h)) is not None

    return shrink(history, shows, SHRINK_BUDGET)


def save(
    out: Path, target: HistoryTarget, seed: int, history: History, row: Row
) -> tuple[Path, str, HistoryVerdict]:
    played, verdict = run_history(target, history)
    evidence = row.explains(played, verdict) or ""
    path = out / f"{row.id}.json"
    save_history(path, target, seed, history, verdict, row=row.id, evidence=evidence)
    return path, evidence, verdict


def _showing(target: HistoryTarget, row: Row, histories: list[History]) -> list[int]:
    """The seeds of ``histories`` that show ``row`` on ``target``."""
    with target.opened():
        return [h.seed for h in histories if row.explains(*run_history(target, h))]


def fixed(
    corpus: Sequence[FixedRow],
    make: Callable[..., HistoryTarget],
    max_seeds: int,
    out: Path,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Each fixed row: the first seed that shows it on its buggy release, shrunk and saved;
    then the same seeds (at least ``COMPARED``) on both releases, and the shrunk history on
    the fix: re-found when some show it on the buggy release and none on the fix."""
    results = []
    for fr in corpus:
        (setup,) = fr.row.setups
        buggy = make(version=fr.buggy, setup=setup)
        start, hit, small = time.perf_counter(), None, None
        with buggy.opened():
            for seed in range(max_seeds):
                history = generate(buggy.shape, seed, fr.row.plan)
                if fr.row.explains(*run_history(buggy, history)):
                    hit = seed
                    small, _ = shrunk(buggy, history, fr.row)
                    save(out, buggy, seed, small, fr.row)
                    break
        fix = make(version=fr.fixed, setup=setup)
        seeds = range(max(COMPARED, 0 if hit is None else hit + 1))
        histories = [generate(fix.shape, seed, fr.row.plan) for seed in seeds]
        on_buggy = _showing(buggy, fr.row, histories)
        on_fix = _showing(fix, fr.row, [*histories, *([small] if small else [])])
        results.append({
            "row": fr.row.id, "setup": setup, "buggy": fr.buggy, "fixed": fr.fixed,
            "found_at_seed": hit, "shrunk_operations": len(small.ops) if small else None,
            "seeds_compared": len(seeds), "shown_on_buggy": len(on_buggy),
            "shown_on_fix": on_fix,
            "verdict": "re-found" if hit is not None and not on_fix else "not re-found",
            "seconds": round(time.perf_counter() - start, 1),
            "saved": f"{fr.row.id}.json" if small else None,
        })  # fmt: skip
        say(f"{fr.row.id}: {results[-1]['verdict']} (first seed {hit}; of seeds 0-{len(seeds) - 1} "
            f"{len(on_buggy)} show it on {fr.buggy}, {len(on_fix)} on {fr.fixed})")  # fmt: skip
    return results


def fixed_table(results: Sequence[dict[str, Any]]) -> list[str]:
    """``fixed``'s results as the markdown table both hunts' docs show."""
    return [
        "| row | setup | buggy | first seed | shrunk to | fixed | seeds compared | "
        "show it on the buggy | on the fix | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| `{r['row']}` | {r['setup']} | {r['buggy']} | {r['found_at_seed']} | "
            f"{r['shrunk_operations']} | {r['fixed']} | {r['seeds_compared']} | "
            f"{r['shown_on_buggy']} | {len(r['shown_on_fix'])} | {r['verdict']} |"
            for r in results
        ),
        "",
        'On the fix, the shrunk history is played too (it counts in "on the fix").',
    ]
