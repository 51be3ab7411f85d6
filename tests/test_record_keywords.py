"""Records of more than three fields are built with keywords, everywhere.

A record is a ``NamedTuple`` or a ``@dataclass`` defined in the source
folders. ``Bound(FULL_KV, pinned, limit, 0, n)`` reads as five unnamed
numbers and breaks silently when a field is added in the middle; with
keywords it cannot. A call is matched to its record through the file's own
class definitions and ``from ... import`` lines, so two records that share a
name (``Verdict``) are told apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

from paths import REPO, SOURCES, module_name

MAX_POSITIONAL_FIELDS = 3


def _is_record(node: ast.ClassDef) -> bool:
    def name(expr: ast.expr) -> str | None:
        expr = expr.func if isinstance(expr, ast.Call) else expr
        return getattr(expr, "id", None) or getattr(expr, "attr", None)

    return any(name(b) == "NamedTuple" for b in node.bases) or any(
        name(d) == "dataclass" for d in node.decorator_list
    )


def _fields(node: ast.ClassDef) -> list[str]:
    return [
        s.target.id
        for s in node.body
        if isinstance(s, ast.AnnAssign)
        and isinstance(s.target, ast.Name)
        and "ClassVar" not in ast.unparse(s.annotation)
    ]


def records() -> dict[tuple[str, str], list[str]]:
    """(module, class name) -> field names, for records with too many fields to
    pass by position (a dataclass that inherits fields is left out)."""
    out = {}
    for folder in SOURCES:
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and _is_record(node):
                    own_base = any(
                        getattr(b, "id", "NamedTuple") != "NamedTuple" for b in node.bases
                    )
                    fields = _fields(node)
                    if len(fields) > MAX_POSITIONAL_FIELDS and not own_base:
                        out[module_name(path), node.name] = fields
    return out


def _resolver(tree: ast.Module, module: str, known: dict) -> dict[str, tuple[str, str]]:
    """Names in one file -> the record they refer to."""
    by_name: dict[str, list[tuple[str, str]]] = {}
    for key in known:
        by_name.setdefault(key[1], []).append(key)
    names = {name: keys[0] for name, keys in by_name.items() if len(keys) == 1}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                local = alias.asname or alias.name
                if (node.module, alias.name) in known:
                    names[local] = (node.module, alias.name)
                elif not node.module.startswith("kvwatch"):  # vLLM's Request, say
                    names.pop(local, None)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = (module, node.name)
    return names


def positional_constructions(
    source: str, module: str, known: dict
) -> list[tuple[int, tuple[str, str]]]:
    """(line, record) of each call in ``source`` that passes a record's fields by position."""
    tree = ast.parse(source)
    names = _resolver(tree, module, known)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        if len(node.args) == 1 and isinstance(node.args[0], ast.Starred):
            continue  # Record(*row): built from a row, not spelled out
        func = node.func
        name = getattr(func, "id", None) or getattr(func, "attr", None)
        if name in names and names[name] in known:
            out.append((node.lineno, names[name]))
    return out


def test_records_with_more_than_three_fields_are_built_with_keywords():
    known = records()
    assert ("kvwatch.contracts", "Bound") in known, "the record scan finds nothing"
    files = [p for folder in (*SOURCES, REPO / "tests") for p in sorted(folder.rglob("*.py"))]
    bad = [
        f"{path.relative_to(REPO)}:{line} {name}"
        for path in files
        for line, (_, name) in positional_constructions(path.read_text(), _module(path), known)
    ]
    assert not bad, "build these with keywords:\n" + "\n".join(bad)


def _module(path: Path) -> str:
    return "tests" if path.is_relative_to(REPO / "tests") else module_name(path)


def test_the_check_sees_a_positional_record():
    source = (
        "from kvwatch.contracts import Bound\n"
        "ok = Bound(group='g', pinned=1, limit=2, shared=0, holders=1)\n"
        "bad = Bound('g', 1, 2, 0, 1)\n"
    )
    found = positional_constructions(source, "tests", records())
    assert found == [(3, ("kvwatch.contracts", "Bound"))]
