"""The mutants: every site the operators find in the lifecycle code, and the
source tree each one runs from.

A mutant's id is ``file:ordinal`` (the ordinal-th site in that file), stable
while the file does not change. ``snapshot`` copies the repository's package
folders once per run, and every mutant is made from that copy, so a run that
takes hours (or resumes the next day) judges one version of the code while
the repository moves on. ``materialize`` writes a copy of the package with one
file mutated; ``PYTHONPATH`` pointing at the copy makes every process started
from it (the gate, its server, its Locust workers) run the mutant, since the
editable install's path entry comes after ``PYTHONPATH``.
"""

from __future__ import annotations

import ast
import random
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from mutation.operators import mutate, sites

REPO = Path(__file__).resolve().parents[1]
# A source tree is a folder whose ``kvwatch/`` is the package: the repository's
# ``src/``, a run's snapshot, a mutant's copy. Mutant files are named relative to
# the package (``engine/scheduler.py`` is ``SOURCE/kvwatch/engine/scheduler.py``).
SOURCE = REPO / "src"
PACKAGE = "kvwatch"
_IGNORED = shutil.ignore_patterns("__pycache__", "README.md")
# The lifecycle code: requests, sessions, slots, the cache and the server's
# per-request state. Left out: the model's arithmetic, the audit, probes and
# usage (the oracles themselves), configs, the fault registry, event types.
SCOPE = (
    "engine/engine.py",
    "engine/scheduler.py",
    "engine/request.py",
    "engine/prefix_wait.py",
    "engine/records.py",
    *(
        f"engine/cache/{name}.py"
        for name in [
            "commit",
            "holder",
            "base",
            "backends",
            "promises",
            "branches",
            "radix_backend",
            "pool",
            "pressure",
            "radix",
            "sessions",
            "slot_backend",
            "slots",
            "storage",
            "holder_table",
            "holder_pages",
            "full_attention",
            "sliding_window",
            "linear_state",
        ]
    ),
    "server/app.py",
    "server/completions.py",
    "server/idle.py",
    "server/session_routes.py",
    "server/worker.py",
)


class Mutant(NamedTuple):
    file: str  # repository path
    ordinal: int  # the site's place among the file's sites
    operator: str
    line: int
    before: str
    after: str

    @property
    def id(self) -> str:
        return f"{self.file}:{self.ordinal}"


def snapshot(root: Path, source: Path = SOURCE) -> Path:
    """``root``: a copy of ``source``'s package, made if it does not exist
    yet (an existing one is kept: the run it belongs to resumes on it), with
    the commit it was taken at in ``root/COMMIT``."""
    if root.exists():
        return root
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source / PACKAGE, partial / PACKAGE, ignore=_IGNORED)
    (partial / "COMMIT").write_text(_commit(source) + "\n")
    partial.rename(root)
    return root


def _commit(source: Path) -> str:
    """``git describe``-like: the commit, and ``+changes`` when the tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--", PACKAGE],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def catalog(scope: tuple[str, ...] = SCOPE, source: Path = SOURCE) -> list[Mutant]:
    """Every mutant, file by file in ``scope`` order, sites in source order."""
    out = []
    for file in scope:
        for i, site in enumerate(sites((source / PACKAGE / file).read_text())):
            out.append(
                Mutant(
                    file=file,
                    ordinal=i,
                    operator=site.operator,
                    line=site.line,
                    before=site.before,
                    after=site.after,
                )
            )
    return out


def sample(mutants: list[Mutant], size: int | None, seed: int) -> list[Mutant]:
    """``size`` mutants drawn from ``seed``, in proportion to each operator's
    share (every operator at least once); all of them when ``size`` is None."""
    if size is None or size >= len(mutants):
        return mutants
    by_operator: dict[str, list[Mutant]] = defaultdict(list)
    for m in mutants:
        by_operator[m.operator].append(m)
    rng = random.Random(seed)
    chosen: list[Mutant] = []
    for group in by_operator.values():
        share = max(1, round(size * len(group) / len(mutants)))
        chosen += rng.sample(group, min(share, len(group)))
    keep = set(chosen)
    return [m for m in mutants if m in keep]


def copy_package(root: Path, source: Path = SOURCE) -> Path:
    """A copy of ``source``'s package under ``root``: the directory to put on
    ``PYTHONPATH``."""
    shutil.copytree(source / PACKAGE, root / PACKAGE, ignore=_IGNORED)
    return root


def materialize(mutant: Mutant, root: Path, source: Path = SOURCE) -> Path:
    """``copy_package`` with the mutant's file changed."""
    copy_package(root, source)
    text = (source / PACKAGE / mutant.file).read_text()
    (root / PACKAGE / mutant.file).write_text(mutate(text, mutant.ordinal))
    return root


def enclosing_function(path: Path, line: int) -> str:
    """The innermost function (``Class.method``) whose lines hold ``line`` in
    the file at ``path``; ``module level`` outside any."""
    best, span = "module level", None
    stack: list[tuple[ast.AST, str]] = [(ast.parse(path.read_text()), "")]
    while stack:
        node, prefix = stack.pop()
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                inside = child.lineno <= line <= end and not isinstance(child, ast.ClassDef)
                if inside and (span is None or end - child.lineno < span):
                    best, span = name, end - child.lineno
                name += "."
            stack.append((child, name))
    return best
