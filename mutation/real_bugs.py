"""The real-bug corpus: bugs real engines shipped, each gated on the release with
the bug and on the release with the fix.

    python -m mutation.real_bugs          # what `make real-bugs` runs
    python -m mutation.real_bugs --engine sglang --only ID  # rerun some rows
    python -m mutation.real_bugs --render # re-render the markdown only

``docs/real-bugs.json`` is a list of rows, one per bug, every key always present::

    {"id": "sglang-pr-22862",            unique; the markdown's anchor
     "engine": "sglang",                 whose bug (sglang, vllm, ...)
     "fix": "PR #22862",                 the change that fixed it (null: none yet)
     "issue": null,                      the report, "issue #N" (null: none)
     "buggy": "0.5.10.post1",            a release with the bug
     "fixed": "0.5.11",                  the first release with the fix (null: none yet)
     "summary": "...",                   what goes wrong, in the engine's own terms
     "trigger": "...",                   what a workload must do to hit it
     "gate": ["--engine", "sglang-cache", "--profile", "sessions", "-c", "4"],
                                         kvwatch gate's flags for both runs (null: no
                                         gate drives it; "note" says why)
     "version_flag": "--sglang-version", the flag the release goes to: the runner adds
                                         [version_flag, buggy] and [version_flag, fixed]
     "expect": "allocator",              the detector that must fail on "buggy"
     "ci": true,                         the test suite runs this row's two gates
                                         (tests/mutation/test_real_bugs_live.py, make test)
     "decided_by": "engine",             what decides the verdicts: "engine", the engine's
                                         own code (SGLang's scheduler and caches as shipped,
                                         vLLM's own scheduler), or "modelled", kvwatch
                                         standing in for part of it (calls made by hand in
                                         its order): such a row is kept, but does not count
     "result": {"buggy": {"exit": 1, "detector": "allocator", "evidence": "..."},
                "fixed": {"exit": 0, "detector": null, "evidence": ""}},
                                         what the last `make real-bugs` measured (null:
                                         not run); detector: the failing one, the
                                         expected one first (null: none failed);
                                         evidence: its evidence line, or the run's
                                         error on exit 3
     "note": "..."}                      anything else; for a row no gate drives,
                                         exactly why

A row holds when its buggy run exits 1 with ``expect`` failing and its fixed
run exits 0 (``problems``); it counts (``counted``) when it holds and the
engine's own code decided both runs; each such row has a swap test
(``tests/targets/{sglang,vllm,lightllm}/test_*_engine_decides.py``: what
kvwatch plays of the engine replaced, the verdicts unmoved). Each run is
``kvwatch gate GATE VERSION_FLAG V --out DIR --no-report`` in a process of
its own. ``docs/real-bugs.md`` is
rendered from the JSON alone (``render``), so the test that checks the
document reads the same rows; only what follows the ``HAND_WRITTEN`` line
(a write-up of a bug hunt, say) is prose kept as it is (``document``).

This module is the command and the schema; the rows are read, written and
judged in ``real_bug_rows.py``, gated in ``real_bug_gates.py`` and rendered in
``real_bugs_report.py``, whose names are imported here for the callers.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from mutation.real_bug_gates import LIGHTLLM_REPO, run_row, side_of
from mutation.real_bug_rows import (
    CORPUS,
    DECIDERS,
    ROOT,
    BugRow,
    Side,
    counted,
    load,
    problems,
    save,
)
from mutation.real_bugs_report import DOC, HAND_WRITTEN, document, generated, render

__all__ = [
    "CORPUS",
    "DECIDERS",
    "DOC",
    "HAND_WRITTEN",
    "LIGHTLLM_REPO",
    "ROOT",
    "BugRow",
    "Side",
    "counted",
    "document",
    "generated",
    "load",
    "main",
    "problems",
    "render",
    "replace",
    "run_row",
    "save",
    "side_of",
]


def _chosen(row: BugRow, args: argparse.Namespace) -> bool:
    """Whether ``--only`` and ``--engine`` ask for ``row`` (every row when neither is given)."""
    return (not args.only or row.id in args.only) and (not args.engine or row.engine in args.engine)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="default: docs/real-bugs.json")
    parser.add_argument("--out", type=Path, default=DOC, help="default: docs/real-bugs.md")
    parser.add_argument("--only", action="append", default=[], metavar="ID", help="rerun these")
    parser.add_argument(
        "--engine", action="append", default=[], help="rerun only these engines' rows"
    )
    parser.add_argument("--render", action="store_true", help="run nothing; render the markdown")
    args = parser.parse_args(argv)
    rows = load(args.corpus)
    if not args.render:
        with tempfile.TemporaryDirectory(prefix="kvwatch-real-bugs-") as tmp:
            rows = [run_row(r, Path(tmp)) if _chosen(r, args) else r for r in rows]
        save(rows, args.corpus)
    previous = args.out.read_text() if args.out.exists() else ""
    args.out.write_text(document(rows, previous))
    wrong = problems(rows)
    print(f"wrote {args.out}: {len(rows)} rows, {len(counted(rows))} count, {len(wrong)} wrong")
    for line in wrong:
        print(f"  {line}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
