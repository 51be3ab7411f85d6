"""Which lines of the lifecycle code each program runs, on the clean code.

    PYTHONPATH=<clean tree> python -m mutation.reach OUT.json

A mutant that no program's oracle sees is either equivalent (its change
leaves behaviour as it was) or out of the programs' reach (they never run
its line). This tells the two apart. It runs, under coverage.py, the
programs ``alive.py`` runs (together: ``base``) and then each program of
``fuzz.DIRECTED`` alone, and writes, per program, the lines it ran in every
file of ``catalog.SCOPE``::

    {"base": {"engine/cache/commit.py": [41, 42, ...], ...},
     "directed": {"radix-pressure-failpoints/2": {...}, ...}}

``score.py`` then judges a mutant no oracle saw: its line in ``base`` makes it
equivalent; else the directed programs whose lines hold it run on the mutant
(a coverage-directed attempt), and only a mutant none of them reaches is
``unreached``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path

import coverage

from mutation import fuzz, serverfuzz
from mutation.catalog import PACKAGE, SCOPE


def module_files() -> dict[str, str]:
    """Each SCOPE file (a path in the package) -> the file Python imports it from."""
    out = {}
    for repo_path in SCOPE:
        module = f"{PACKAGE}/{repo_path[:-3]}".replace("/", ".")
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise RuntimeError(f"cannot find {module} for {repo_path}")
        out[repo_path] = str(Path(spec.origin).resolve())
    return out


def lines_run(work: Callable[[], object], files: dict[str, str]) -> dict[str, list[int]]:
    """The lines of ``files`` that ``work()`` ran, by repository path."""
    cov = coverage.Coverage(data_file=None, include=list(files.values()))
    cov.start()
    try:
        work()
    finally:
        cov.stop()
    data = cov.get_data()
    return {repo: sorted(data.lines(path) or ()) for repo, path in files.items()}


def _base() -> None:
    for program in fuzz.PROGRAMS:
        fuzz.run(program)
    for program in serverfuzz.PROGRAMS:
        serverfuzz.run(program)


def measure() -> dict:
    files = module_files()
    directed = {
        p.name: lines_run(lambda p=p: fuzz.run(p), files) for p in fuzz.DIRECTED
    }  # fmt: skip
    return {"base": lines_run(_base, files), "directed": directed}


def reaching(reach: dict, file: str, line: int) -> tuple[bool, list[str]]:
    """Whether the base programs run ``file:line``, and which directed ones do."""
    base = line in reach["base"].get(file, ())
    directed = [name for name, lines in reach["directed"].items() if line in lines.get(file, ())]
    return base, directed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mutation.reach OUT.json", file=sys.stderr)
        return 2
    Path(args[0]).write_text(json.dumps(measure()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
