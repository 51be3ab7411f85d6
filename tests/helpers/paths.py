"""Where things lie in the repository, for a test in any folder under ``tests/``.

REPO      the checkout's root (README.md, docs/, Makefile)
PACKAGE   src/kvwatch: module ``kvwatch.a.b`` is ``PACKAGE / "a/b.py"``
DATA      tests/data: recorded gate outputs and soaks
MUTATION, HUNTS  the mutation programs and the hunts (beside src/, not in the wheel)
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "kvwatch"
DATA = REPO / "tests" / "data"
MUTATION = REPO / "mutation"
HUNTS = REPO / "hunts"
# every folder of source code, tests aside: the package, the mutation programs and
# the hunts
SOURCES = (PACKAGE, MUTATION, HUNTS)


def module_name(path: Path) -> str:
    """The dotted name a source file imports as: ``kvwatch.engine.cache.pool`` for
    ``src/kvwatch/engine/cache/pool.py``, ``mutation.score`` for ``mutation/score.py``."""
    rel = path.resolve().relative_to(
        PACKAGE.parent if path.resolve().is_relative_to(PACKAGE) else REPO
    )
    parts = rel.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
