"""``make lightllm-hunt``: LightLLM checkouts × caches × profiles × seeds × concurrencies.

    python -m hunts.lightllm --out docs/lightllm-hunt --corpus docs/real-bugs.json
                             --lightllm-src DIR [--lightllm-src DIR2] [--seeds 8]
                             [-c 2 4 8] [--jobs 2] [--relabel]

The matrix: each (checkout, cache, seed) is one ``kvwatch gate --engine
lightllm-cache --lightllm-src DIR --lightllm-cache K -c 2,4,8 --seed S``
process, as a user runs it (``gates.py``; ``runner.py`` runs them and writes
both files): every profile (``prefix-share``, ``chunked``,
``aborts``, ``pressure``) at every concurrency, judged by every detector the
gate composes for this target, LightLLM's own infer loop deciding each run.
A checkout without the ``linear`` cache (before LightLLM's PR #1265) gives
``unsupported`` rows with the reason, not findings. A finding a corpus row
explains is labelled with its id (``corpus.py``): same profile,
detector and pool, on a checkout that does not contain that row's fix
(``git merge-base --is-ancestor``; without git, the row's own commit).
``--lightllm-src`` defaults to ``KVWATCH_LIGHTLLM_SRC``; without either it is
exit 2.

Invariant: a row is a function of (checkout, cache, profile, seed, c); LightLLM
has no page size here (``page`` is 1), and rows keep the matrix's order.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from hunts import gates, runner
from hunts.corpus import HuntedEngine, load_corpus
from kvwatch.targets.lightllm.checkout_check import commit_of, find_checkout

CACHES = ("radix", "linear")
PROFILES = ("prefix-share", "chunked", "aborts", "pressure")
LOADED = re.compile(r"^LightLLM .*: its \S+ cache and infer loop on CPU$", re.MULTILINE)


def decided_by(console: str) -> str | None:
    """LightLLM's own loop decides every run the target loaded; None: nothing loaded."""
    return "LightLLM's own infer loop" if LOADED.search(console) else None


def contains(folder: Path, commit: str) -> bool | None:
    """Whether the checkout at ``folder`` has ``commit`` in its history (None: git cannot say)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "merge-base", "--is-ancestor", commit, "HEAD"],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {0: True, 1: False}.get(done.returncode)


def engine(corpus: list[dict], folders: dict[str, Path]) -> HuntedEngine:
    """The hunt's engine; ``folders`` maps each release label to its checkout."""

    def before_fix(release: str, bug: dict) -> bool:
        has_fix = contains(folders[release], bug["fixed"]) if bug.get("fixed") else False
        if has_fix is None:
            return (bug.get("buggy") or "").startswith(release)
        return not has_fix

    return HuntedEngine(
        name="lightllm",
        decided_by=decided_by,
        before_fix=before_fix,
        profiles=PROFILES,
        corpus=corpus,
    )


def label(folder: Path) -> str:
    """A checkout's release label: its commit's first 12 digits, else its folder."""
    commit = commit_of(folder)
    return commit[:12] if commit else str(folder)


def groups(folders: dict[str, Path], seeds: int) -> list[gates.Group]:
    """Every gate of the hunt, in a stable order: checkout, cache, seed."""
    out = []
    for release, folder in folders.items():
        for cache in CACHES:
            try:
                find_checkout(folder, cache)
                refused = None
            except ValueError as exc:
                refused = str(exc)
            args = ("--engine", "lightllm-cache", "--lightllm-src", str(folder))
            args += ("--lightllm-cache", cache)
            out += [
                gates.Group(
                    release=release, cache=cache, page=1, seed=s, args=args, refused=refused
                )
                for s in range(seeds)
            ]
    return out


TITLE = "LightLLM cache hunt"
INTRO = (
    "Written by `make lightllm-hunt` (`python -m hunts.lightllm`): one",
    "`kvwatch gate --engine lightllm-cache --lightllm-src DIR --lightllm-cache K --seed S -c ...`",
    "per checkout (named by its commit), cache and seed, every profile, every detector the gate",
    "composes (`src/kvwatch/targets/lightllm/README.md`). LightLLM's own infer loop",
    "decides every run; the model, sampler and router are stand-ins. Layouts are `radix/p1`",
    "(`RadixCache`) and `linear/p1` (`LinearAttPagedRadixCache`). A finding labelled known is",
    "explained by that row of `docs/real-bugs.json`; a candidate's upstream search is written",
    "below the marker.",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m hunts.lightllm")
    ap.add_argument("--lightllm-src", action="append", default=[], help="repeatable")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("-c", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=1200, help="seconds a gate may run")
    ap.add_argument(
        "--relabel",
        action="store_true",
        help="run nothing: label OUT.json's findings against the corpus again, rewrite OUT.md",
    )
    ap.add_argument("--out", required=True, help="OUT.json and OUT.md (make: docs/lightllm-hunt)")
    ap.add_argument(
        "--corpus", required=True, help="the real-bug corpus (make: docs/real-bugs.json)"
    )
    args = ap.parse_args(argv)
    if not args.lightllm_src and os.environ.get("KVWATCH_LIGHTLLM_SRC"):
        args.lightllm_src = [os.environ["KVWATCH_LIGHTLLM_SRC"]]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.lightllm_src:
        print(
            "lightllm-hunt: give a LightLLM checkout: --lightllm-src DIR "
            "(make lightllm-hunt LIGHTLLM_SRC=DIR) or KVWATCH_LIGHTLLM_SRC=DIR",
            file=sys.stderr,
        )
        return 2
    folders = {label(Path(d).resolve()): Path(d).resolve() for d in args.lightllm_src}
    hunted = engine(load_corpus(Path(args.corpus)), folders)
    if args.relabel:
        return gates.relabelled(Path(args.out), hunted, title=TITLE, intro=INTRO)
    matrix = (
        f"checkouts {', '.join(folders)}; caches {', '.join(CACHES)}; "
        f"{args.seeds} seeds; c = {', '.join(map(str, args.c))}"
    )
    plan = gates.plan(
        hunted, groups(folders, args.seeds), args, matrix=matrix, title=TITLE, intro=INTRO
    )
    return runner.hunt(plan, args)


if __name__ == "__main__":
    raise SystemExit(main())
