"""A cache's parts stay behind its façade: nothing outside ``kvwatch.engine.cache``
reaches into a cache's ``store``, ``working`` or ``holders`` (public or
underscored), not the rest of the package, not the mutation programs, not the
tests outside ``tests/engine/cache``. They call the cache's contract
(``PrefixCache``, ``branches``, ``reads``) and read its ``view``.

The scan is ``ast``: an attribute of that name read off anything that names a
cache. A cache is named by an identifier with "cache" in it anywhere along the
receiver (``cache``, ``self.cache``, ``engine._cache``, ``cache.view``), or by
a local name bound to a call that builds one (``c = build_cache(...)``,
``radix = RadixPrefixCache(...)``) or annotated as one (``c: CacheBase``);
``getattr(cache, "holders")`` counts too. A holder's own ``working`` table or
another object's ``holders`` is not a cache's, and not flagged."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from paths import MUTATION, PACKAGE, REPO

INTERNALS = frozenset({"store", "working", "holders", "_store", "_working", "_holders"})
CACHE_WORD = re.compile("cache", re.IGNORECASE)
INSIDE = (PACKAGE / "engine" / "cache", REPO / "tests" / "engine" / "cache")


def receiver_names(node: ast.expr) -> list[str]:
    """The identifiers along an attribute's receiver: ``engine._cache.view`` ->
    ["view", "_cache", "engine"] (through calls and subscripts)."""
    out = []
    while True:
        if isinstance(node, ast.Attribute):
            out.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Name):
            return [*out, node.id]
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return out


def cache_locals(tree: ast.AST) -> set[str]:
    """Names bound to a cache: assigned from a call to something with "cache" in
    its name (``build_cache``, ``SlotPrefixCache``), or annotated with such a type."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if any(CACHE_WORD.search(n) for n in receiver_names(node.value.func)):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            target = node.arg if isinstance(node, ast.arg) else getattr(node.target, "id", "")
            if target and CACHE_WORD.search(ast.unparse(node.annotation)):
                names.add(target)
    return names


def names_a_cache(receiver: ast.expr, bound: set[str]) -> bool:
    return any(CACHE_WORD.search(n) or n in bound for n in receiver_names(receiver))


def reaches(source: str) -> list[str]:
    """Every read of a cache's store, working or holders in ``source``."""
    tree = ast.parse(source)
    bound = cache_locals(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in INTERNALS:
            if names_a_cache(node.value, bound):
                found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "") in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in INTERNALS
            and names_a_cache(node.args[0], bound)
        ):
            found.append((node.lineno, ast.unparse(node)))
    return [f"line {line}: {code}" for line, code in sorted(found)]


def outside_the_cache() -> list[Path]:
    roots = (PACKAGE, MUTATION, REPO / "tests")
    files = sorted({p for root in roots for p in root.rglob("*.py")})
    return [p for p in files if not any(p.is_relative_to(inside) for inside in INSIDE)]


def test_nothing_outside_the_cache_reaches_into_its_parts():
    files = outside_the_cache()
    scanned = {p.relative_to(REPO).as_posix() for p in files}
    assert {"src/kvwatch/engine/engine.py", "tests/helpers/cachesim.py"} <= scanned
    assert "mutation/fuzz.py" in scanned and "tests/engine/test_engine.py" in scanned
    assert not any(name.startswith("src/kvwatch/engine/cache/") for name in scanned)
    found = {}
    for path in files:
        if hits := reaches(path.read_text()):
            found[path.relative_to(REPO).as_posix()] = hits
    assert not found, f"reaches into a cache's parts: {found}"


def test_the_scan_catches_each_way_of_reaching_in():
    planted = (
        "def f(engine, run, c2: CacheBase, rules, holder):\n"
        "    engine._cache.holders.values()\n"
        "    run.engine._cache.store.failpoints.hits\n"
        "    self.cache.working.swa_table(h, 0, 1)\n"
        "    cache.view.holders\n"
        "    radix = build_cache(config)\n"
        "    radix._store.tree\n"
        "    c2.holders\n"
        "    getattr(cache, 'store')\n"
        "    rules.holders, holder.working, 'admit.working', worker.store\n"
    )
    assert reaches(planted) == [
        "line 2: engine._cache.holders",
        "line 3: run.engine._cache.store",
        "line 4: self.cache.working",
        "line 5: cache.view.holders",
        "line 7: radix._store",
        "line 8: c2.holders",
        "line 9: getattr(cache, 'store')",
    ]
