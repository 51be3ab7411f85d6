"""``make sglang-hunt``: SGLang releases × caches × page sizes × profiles × seeds × concurrencies.

    python -m hunts.sglang --out docs/sglang-hunt --corpus docs/real-bugs.json
                           [--releases 0.5.10.post1 0.5.23 | all] [--seeds 3] [-c 2 4]
                           [--jobs 2] [--relabel]

The matrix: each (release, layout, seed) is one ``kvwatch gate --engine
sglang-cache --sglang-version V --sglang-cache K --page-size P -c 2,4 --seed S``
process, as a user runs it (``gates.py``; ``runner.py`` runs them and writes
both files): every profile the release runs, at every concurrency, judged by
every detector the gate composes for this target. A profile the release
cannot run (``kvwatch.targets.sglang.loop_choice.check``: the session profiles
before 0.5.10rc0, ``swa`` before 0.5.13.post1) and a release not built here
are ``unsupported`` rows with the target's reason, not findings. Each row says
what decided it (SGLang's own ``Scheduler``, from the target's console line).
A finding a corpus row explains is labelled with its id (``corpus.py``): same
profile, detector and pool, on a release before that row's fix.

The default releases are the newest few and those on either side of the
corpus's bug rows (about 10 minutes on 2 cores); ``--releases all`` runs
every release the target knows of (``ALL``).

Invariant: a row is a function of (release, cache, page size, profile,
seed, c); rows keep the matrix's order whatever ``--jobs`` is.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

from hunts import gates, runner
from hunts.corpus import HuntedEngine, load_corpus

ALL = (
    "0.5.4.post3",
    "0.5.5",
    "0.5.9",
    "0.5.10rc0",
    "0.5.10",
    "0.5.10.post1",
    "0.5.11",
    "0.5.12",
    "0.5.13.post1",
    *("0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21"),
    "0.5.22",
    "0.5.23",
)
DEFAULT = (  # the corpus's bug rows' releases and their fixes, and the newest
    "0.5.4.post3",
    "0.5.5",
    "0.5.9",
    "0.5.10",
    "0.5.10.post1",
    "0.5.11",
    "0.5.13.post1",
    "0.5.21",
    "0.5.22",
    "0.5.23",
)
LAYOUTS = (  # (cache, page size): mamba takes page size 1 only
    ("radix", 1),
    ("radix", 4),
    ("radix", 16),
    ("swa", 1),
    ("swa", 4),
    ("swa", 16),
    ("mamba", 1),
)
DRIVEN_BY = re.compile(r"^sglang \S+: driven by (.+)$", re.MULTILINE)
WHO = {"its own Scheduler": "SGLang's own Scheduler"}


def decided_by(console: str) -> str | None:
    """Who stepped the release, from the target's console line; None: nothing loaded it."""
    found = DRIVEN_BY.search(console)
    return WHO.get(found.group(1).strip(), found.group(1).strip()) if found else None


def before_fix(release: str, bug: dict) -> bool:
    """Whether ``release`` comes before the corpus row's fixed release."""
    fixed = (bug.get("fixed") or "").split(" ")[0]
    try:
        return Version(release) < Version(fixed)
    except InvalidVersion:
        return False


def engine(corpus: list[dict]) -> HuntedEngine:
    return HuntedEngine(
        name="sglang",
        decided_by=decided_by,
        before_fix=before_fix,
        corpus=corpus,
    )


def groups(releases: list[str], seeds: int) -> list[gates.Group]:
    """Every gate of the hunt, in a stable order: release, layout, seed."""
    out = []
    for release in releases:
        for cache, page in LAYOUTS:
            args = ("--engine", "sglang-cache", "--sglang-version", release)
            args += ("--sglang-cache", cache, "--page-size", str(page))
            out += [
                gates.Group(release=release, cache=cache, page=page, seed=s, args=args)
                for s in range(seeds)
            ]
    return out


TITLE = "SGLang cache hunt"
INTRO = (
    "Written by `make sglang-hunt` (`python -m hunts.sglang`): one",
    "`kvwatch gate --engine sglang-cache --sglang-version V --sglang-cache K --page-size P",
    "--seed S -c ...` per release, layout and seed, every profile the release runs, every",
    "detector the gate composes (`src/kvwatch/targets/sglang/README.md`).",
    "'decided by' is what stepped the release: SGLang's own `Scheduler` on every release",
    "driven (0.5.4.post3 .. 0.5.23). A finding labelled known is explained by that row of",
    "`docs/real-bugs.json`; a candidate's upstream search is written below the marker.",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m hunts.sglang")
    ap.add_argument("--releases", nargs="+", default=list(DEFAULT), help="'all': every one")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("-c", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=1200, help="seconds a gate may run")
    ap.add_argument(
        "--relabel",
        action="store_true",
        help="run nothing: label OUT.json's findings against the corpus again, rewrite OUT.md",
    )
    ap.add_argument("--out", required=True, help="OUT.json and OUT.md (make: docs/sglang-hunt)")
    ap.add_argument(
        "--corpus", required=True, help="the real-bug corpus (make: docs/real-bugs.json)"
    )
    args = ap.parse_args(argv)
    if args.releases == ["all"]:
        args.releases = list(ALL)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hunted = engine(load_corpus(Path(args.corpus)))
    if args.relabel:
        return gates.relabelled(Path(args.out), hunted, title=TITLE, intro=INTRO)
    matrix = (
        f"releases {', '.join(args.releases)}; layouts "
        f"{', '.join(f'{k}/p{p}' for k, p in LAYOUTS)}; {args.seeds} seeds; "
        f"c = {', '.join(map(str, args.c))}"
    )
    work = groups(args.releases, args.seeds)
    plan = gates.plan(hunted, work, args, matrix=matrix, title=TITLE, intro=INTRO)
    return runner.hunt(plan, args)


if __name__ == "__main__":
    raise SystemExit(main())
