"""The corpus of real bugs (``docs/real-bugs.json``) as a gate hunt reads it: which row
explains a finding.

``known(engine, row, detector, evidence)`` is the id of the corpus row that
explains ``detector`` failing in a hunt's ``row``: same engine, detector and
pool group (``sglang.kv``, ``lightllm.state``, ... read from the evidence, so a
bug of the KV pool is known under every cache that has one, a bug of the
mamba pool only under the mamba cache), on a build before that row's fix (the
engine's ``before_fix``), and either the row's profile or, in another
profile, the same cause (``cause``: the first holder clause with names and
numbers blanked, such as "last held by request # mamba_pool_idx #,
aborted-in-queue at step #"); None marks a candidate. ``after_known`` labels
what a drain leaves after a known bug stopped a run; ``relabel`` labels
stored rows again against the corpus as it is now.

Invariant: the corpus is read from the path the caller gives (the Makefile's
``docs/real-bugs.json``), never from the working directory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DURING = re.compile(r"turn \d+: ")
POOL = re.compile(r"(?:turn \d+|after the drain): ([a-z_]+\.[a-z_]+):")


@dataclass(frozen=True, kw_only=True)
class HuntedEngine:
    """What differs between the engines a gate hunt drives."""

    name: str  # the corpus's engine
    decided_by: Callable[[str], str | None]  # the console -> who decided; None: not loaded
    before_fix: Callable[[str, dict], bool]  # (release, corpus row) -> release has the bug
    profiles: tuple[str, ...] = ()  # every profile of the target (rows of a refused group)
    corpus: list[dict] = field(default_factory=list)


def load_corpus(path: Path) -> list[dict]:
    """The corpus at ``path`` (none there: an empty one, every finding a candidate)."""
    return json.loads(Path(path).read_text()) if Path(path).exists() else []


def flag(args: Sequence[str] | None, name: str, default: str | None = None) -> str | None:
    """The value after ``name`` in a gate command line."""
    args = list(args or ())
    return args[args.index(name) + 1] if name in args else default


def pool_of(evidence: str | None) -> str | None:
    """The pool group an evidence line names first (``sglang.kv``), or None."""
    found = POOL.search(evidence or "")
    return found.group(1) if found else None


def cause(evidence: str | None) -> str:
    """The evidence's first holder clause (or its first clause), names and numbers blanked."""
    text = evidence or ""
    if "last held by" in text:
        text = "last held by" + text.split("last held by", 1)[1]
    text = re.split(r"[;)]", text, maxsplit=1)[0]
    return re.sub(r"[\w.-]*\d[\w.-]*", "#", text).strip()


def buggy_evidence(bug: dict) -> str:
    """The corpus row's evidence on its buggy build (its ``result`` as stored)."""
    found = re.search(r"'evidence': '([^']*)'", str(bug.get("result")))
    return found.group(1) if found else ""


def known(engine: HuntedEngine, row: dict, detector: str, evidence: str) -> str | None:
    """The corpus row that explains ``detector`` failing in ``row`` with ``evidence``, or None."""
    for bug in engine.corpus:
        gate = bug.get("gate")
        if bug.get("engine") != engine.name or not gate or bug.get("expect") != detector:
            continue
        theirs = buggy_evidence(bug)
        if pool_of(theirs) != pool_of(evidence):
            continue
        if flag(gate, "--profile") != row["profile"] and cause(theirs) != cause(evidence):
            continue
        if engine.before_fix(row["release"], bug):
            return bug["id"]
    return None


def after_known(findings: list[dict]) -> list[dict]:
    """Findings of the drain in a run a known bug stopped during its turns, labelled with it.

    A run whose turns showed a known bug (a stalled scheduler, a leaked unit) cannot
    drain clean: what is left after the drain (sessions the stalled scheduler never
    closed, the pages they hold) follows from that bug, so it carries its id and
    ``after_known`` rather than standing as a candidate of its own.
    """
    first = next((f["known"] for f in findings if f["known"] and DURING.match(f["evidence"])), None)
    if first is None:
        return findings
    return [
        f | {"known": first, "after_known": True}
        if not f["known"] and f["evidence"].startswith("after the drain")
        else f
        for f in findings
    ]


def relabel(engine: HuntedEngine, rows: list[dict]) -> list[dict]:
    """Stored rows with every finding labelled again against ``engine.corpus``."""
    out = []
    for row in rows:
        fresh = [
            {k: v for k, v in f.items() if k != "after_known"}
            | {"known": known(engine, row, f["detector"], f["evidence"])}
            for f in row["findings"]
        ]
        out.append(row | {"findings": after_known(fresh)})
    return out
