"""The cache's modules import downward only: no cycle among them, not even a
type-only one (an import under ``if TYPE_CHECKING:`` is a dependency of
meaning: the module cannot be read without the other).

The graph is built from the source with ``ast``: every ``import`` and
``from ... import`` anywhere in a module (at the top, under ``TYPE_CHECKING``,
inside a function) that names another module of ``kvwatch.engine.cache``."""

from __future__ import annotations

import ast

from paths import PACKAGE

CACHE = PACKAGE / "engine" / "cache"
DOTTED = "kvwatch.engine.cache"


def cache_imports(source: str, modules: set[str]) -> set[str]:
    """The cache modules ``source`` imports, by their names in the folder."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(f"{DOTTED}."):
                    found.add(alias.name.split(".")[3])
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # a relative import, from inside the folder
                found.update([module.split(".")[0]] if module else [a.name for a in node.names])
            elif module == DOTTED:
                found.update(alias.name for alias in node.names)
            elif module.startswith(f"{DOTTED}."):
                found.add(module.split(".")[3])
    return found & modules


def import_graph() -> dict[str, set[str]]:
    """Each module of the cache folder -> the cache modules it imports."""
    paths = sorted(CACHE.glob("*.py"))
    modules = {p.stem for p in paths}
    return {p.stem: cache_imports(p.read_text(), modules) - {p.stem} for p in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One closed path per strongly connected group of modules that import each
    other (a cycle found by depth-first search, each reported once)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                loop = [*path[path.index(dep) :], dep]
                if frozenset(loop) not in seen:
                    seen.add(frozenset(loop))
                    found.append(loop)
            elif dep not in state:
                visit(dep)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def test_no_module_of_the_cache_imports_its_way_back_to_itself():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_graph_reads_real_imports_type_only_ones_included():
    graph = import_graph()
    assert {"base", "storage", "holder", "protocol", "radix_backend"} <= set(graph)
    assert "storage" in graph["base"] and "holder_pages" in graph["base"]
    assert "view" in graph["audit"] and "claims" in graph["view"]  # claims: TYPE_CHECKING only


def test_the_scan_sees_every_form_of_import_and_the_check_finds_a_cycle():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import kvwatch.engine.cache.pool\n"
        "from kvwatch.engine.cache import reads\n"
        "from kvwatch.engine.cache.node import Node\n"
        "from . import usage\n"
        "if TYPE_CHECKING:\n"
        "    from kvwatch.engine.cache.base import CacheBase\n"
        "def f():\n"
        "    from kvwatch.engine.cache.audit import audit\n"
        "from kvwatch.engine.config import FULL_KV\n"
    )
    modules = {"pool", "reads", "node", "usage", "base", "audit", "storage"}
    assert cache_imports(source, modules) == modules - {"storage"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(sorted(c) for c in cycles(graph)) == [["a", "a", "b", "c"], ["e", "e"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
