"""Score the gate on the hand-written bugs of ``fresh_bugs.py``: ``make fresh``.

    python -m mutation.fresh [--only ID ...] [--tiers quick default] [--work DIR]

For every bug, on its own copy of the package (``catalog.copy_package``, the
bug's text replaced once), two whole gates, as a user's CI would run them:

    quick     ``kvwatch gate --quick`` (every profile at c = 2, 16 replays a run)
    default   ``kvwatch gate`` (every profile at c = 1, 2, 4, 8, every request replayed)

Each exit code and failing detectors go to ``docs/fresh-bugs.json`` as the
bugs finish (a stopped run resumes: a bug is run again only for the tiers it
lacks; ``--only`` reruns some; ``--tiers quick`` runs the quick tier alone,
about a tenth of the time), and
``docs/mutation-score.md``'s section on them is rendered from that file
(``fresh_report.py``), apart from the generated mutants.
"""

from __future__ import annotations

import argparse
import json
import py_compile
import shutil
from collections.abc import Sequence
from pathlib import Path

from mutation import fresh_report, score_report
from mutation.catalog import PACKAGE, SOURCE, copy_package
from mutation.fresh_bugs import FRESH, FreshBug
from mutation.score import _gate

TIERS = {"quick": ("--quick",), "default": ()}


def planted(bug: FreshBug, root: Path, source: Path = SOURCE) -> Path:
    """A copy of the package under ``root`` with ``bug`` in it; ValueError when its
    text is not in the file exactly once (the code moved on: the bug needs rewriting)."""
    path = source / PACKAGE / bug.file
    text = path.read_text()
    if text.count(bug.find) != 1:
        raise ValueError(f"{bug.id}: {bug.file} holds its text {text.count(bug.find)} times")
    copy_package(root, source)
    target = root / PACKAGE / bug.file
    target.write_text(text.replace(bug.find, bug.replace))
    py_compile.compile(str(target), doraise=True)
    return root


def run_bug(bug: FreshBug, work: Path, tiers: Sequence[str] = tuple(TIERS)) -> dict:
    """``{tier: {"exit": code, "detectors": [...]}}`` for each of ``tiers``."""
    tree = work / bug.id
    shutil.rmtree(tree, ignore_errors=True)
    planted(bug, tree / "src")
    out = {}
    for tier in tiers:
        code, failed = _gate(tree / "src", tree / tier, TIERS[tier])
        out[tier] = {"exit": code, "detectors": list(failed)}
    shutil.rmtree(tree / "src", ignore_errors=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mutation.fresh")
    parser.add_argument("--only", nargs="*", default=None, help="bug ids to (re)run")
    parser.add_argument("--tiers", nargs="+", choices=list(TIERS), default=list(TIERS))
    parser.add_argument("--work", type=Path, default=Path("kvwatch-out/fresh"))
    args = parser.parse_args(argv)
    results = fresh_report.load()
    for bug in FRESH:
        if args.only and bug.id not in args.only:
            continue
        had = results.get(bug.id, {})
        tiers = args.tiers if args.only else [t for t in args.tiers if t not in had]
        if not tiers:
            continue
        print(f"{bug.id} ...", flush=True)
        results[bug.id] = {**had, **run_bug(bug, args.work.resolve(), tiers)}
        fresh_report.save(results)
        print(f"{bug.id}: {json.dumps(results[bug.id])}", flush=True)
    verdicts, meta = score_report.load(score_report.DOC)
    score_report.DOC.write_text(score_report.render(verdicts, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
