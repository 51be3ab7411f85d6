"""``docs/fresh-bugs.json`` and the section of ``docs/mutation-score.md`` rendered from it.

The JSON maps a bug's id (``fresh_bugs.py``) to what each tier did with it:
``{"quick": {"exit": 1, "detectors": ["requests"]}, "default": {...}}``. The
section lists every bug of the catalog, run or not, with its tiers' verdicts
and, for a miss, the cause written in the catalog.
"""

from __future__ import annotations

import json
from pathlib import Path

from mutation.fresh_bugs import FRESH, FreshBug

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "fresh-bugs.json"
TIERS = ("quick", "default")


def load(path: Path = RESULTS) -> dict[str, dict]:
    return json.loads(path.read_text()) if path.exists() else {}


def save(results: dict[str, dict], path: Path = RESULTS) -> None:
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def _cell(result: dict | None) -> str:
    if result is None:
        return "not run"
    if result["exit"] == 0:
        return "**missed**"
    detectors = ", ".join(f"`{d}`" for d in result["detectors"]) or "no detector named"
    return f"caught (exit {result['exit']}: {detectors})"


def _row(bug: FreshBug, result: dict) -> str:
    cells = [_cell(result.get(tier)) for tier in TIERS]
    miss = bug.miss or ("" if "missed" not in " ".join(cells) else "cause not yet read")
    return (
        f"| `{bug.id}` | `{bug.file}`: {bug.summary} | {bug.written} | "
        + " | ".join(cells)
        + f" | {miss} |"
    )


def section(results: dict[str, dict] | None = None) -> list[str]:
    """The markdown lines of the fresh-bug section (empty when nothing was ever run)."""
    results = load() if results is None else results
    if not results:
        return []
    ran = [b for b in FRESH if b.id in results]

    def caught(tier: str, pool: list[FreshBug]) -> str:
        """Caught of those the tier ran (a bug may have run through one tier only)."""
        run = [results[b.id][tier] for b in pool if tier in results[b.id]]
        return f"{sum(1 for r in run if r['exit'] != 0)} of {len(run)}"

    held = [b for b in ran if b.written == "held out"]
    lines = [
        "",
        "## Fresh hand-written bugs",
        "",
        "Realistic mistakes written by hand against the engine and server, each on a path",
        "they promise something about (`mutation/fresh_bugs.py`), scored apart from the",
        "generated mutants by `make fresh` (`python -m mutation.fresh`) through two whole",
        "gates: the quick tier (`kvwatch gate --quick`) and the default gate (`kvwatch",
        "gate`). A bug written *with its oracle* shows that oracle works; only *held out*",
        "bugs measure the gate.",
        "",
        f"Caught: quick {caught('quick', ran)}, default {caught('default', ran)} of all run; "
        f"held out: quick {caught('quick', held)}, default {caught('default', held)}.",
        "",
        "| bug | where and what | written | quick | default | why a tier missed it |",
        "|---|---|---|---|---|---|",
    ]
    return lines + [_row(b, results.get(b.id, {})) for b in FRESH]
