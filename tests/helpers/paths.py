"""Where things lie in the repository, for a test in any folder under ``tests/``.

REPO      the checkout's root (README.md, docs/, Makefile)
PACKAGE   src/kvwatch: module ``kvwatch.a.b`` is ``PACKAGE / "a/b.py"``
DATA      tests/data: recorded gate outputs and soaks
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "kvwatch"
DATA = REPO / "tests" / "data"
MUTATION = REPO / "mutation"
# every folder of source code, tests aside: the package and the mutation programs
SOURCES = (PACKAGE, MUTATION)


def module_name(path: Path) -> str:
    """The dotted name a source file imports as: ``kvwatch.engine.cache.pool`` for
    ``src/kvwatch/engine/cache/pool.py``, ``mutation.score`` for ``mutation/score.py``."""
    rel = path.resolve().relative_to(
        PACKAGE.parent if path.resolve().is_relative_to(PACKAGE) else REPO
    )
    parts = rel.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
