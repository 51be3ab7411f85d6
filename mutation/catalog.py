"""The mutants: every site the operators find in the lifecycle code, and the
source tree each one runs from.

A mutant's id is ``file:ordinal`` (the ordinal-th site in that file), stable
while the file does not change. ``materialize`` writes a copy of the package
with that one file mutated; ``PYTHONPATH`` pointing at the copy makes every
process started from it (the gate, its server, its Locust workers) run the
mutant, since the editable install's finder comes after ``sys.path``.
"""

from __future__ import annotations

import random
import shutil
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from kvwatch.mutation.operators import mutate, sites

REPO = Path(__file__).resolve().parents[1]
# the repository folder behind each kvwatch package
PACKAGES = {
    "kvwatch": "kvwatch",
    "kvwatch/engine": "engine",
    "kvwatch/server": "server",
    "kvwatch/instrumentation": "instrumentation",
    "kvwatch/loadtests": "loadtests",
    "kvwatch/dashboards": "dashboards",
    "kvwatch/mutation": "mutation",
}
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
            "hybrid",
            "pool",
            "pressure",
            "radix",
            "sessions",
            "slotcache",
            "slots",
            "storage",
            "working",
        ]
    ),
    "server/app.py",
    "server/completions.py",
    "server/idle.py",
    "server/sessions.py",
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


def catalog(scope: tuple[str, ...] = SCOPE) -> list[Mutant]:
    """Every mutant, file by file in ``scope`` order, sites in source order."""
    out = []
    for file in scope:
        for i, site in enumerate(sites((REPO / file).read_text())):
            out.append(Mutant(file, i, site.operator, site.line, site.before, site.after))
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


def materialize(mutant: Mutant, root: Path) -> Path:
    """A copy of the package under ``root`` with the mutant's file changed; the
    directory to put on ``PYTHONPATH``."""
    for package, folder in PACKAGES.items():
        shutil.copytree(
            REPO / folder, root / package, ignore=shutil.ignore_patterns("__pycache__", "README.md")
        )
    package_file = _package_path(mutant.file)
    source = (REPO / mutant.file).read_text()
    (root / package_file).write_text(mutate(source, mutant.ordinal))
    return root


def _package_path(file: str) -> str:
    folder, _, rest = file.partition("/")
    for package, repo_folder in PACKAGES.items():
        if repo_folder == folder:
            return f"{package}/{rest}"
    raise ValueError(f"{file} is in no kvwatch package")
