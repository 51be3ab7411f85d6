"""No source function is longer than 60 lines (the package, mutation/ and hunts/).

A function's length is its ``def`` line through the last line of its body
(decorators left out): ``node.end_lineno - node.lineno + 1``. Methods and
nested functions count on their own, named by their qualified name
(``Class.method``, ``outer.inner``). A long function is one that does several
jobs; split into helpers with one job each, it reads and tests in parts.

Functions known to be longer, which are still to be split, are named in
``ALLOWED`` with their length when listed. The list only shrinks: an entry
whose function grew, shrank to 60 lines or less, or is gone fails the test
until the entry is updated or removed.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import NamedTuple

from paths import REPO, SOURCES

# the package and the mutation programs (``paths.SOURCES``), and the hunts beside them
FOLDERS = (*(str(folder.relative_to(REPO)) for folder in SOURCES), "hunts")
LIMIT = 60

# "path:qualified name" -> its length when listed; still to be split.
ALLOWED: dict[str, int] = {}


class Long(NamedTuple):
    path: str  # relative to the root, with "/"
    line: int
    name: str  # qualified: Class.method, outer.inner
    length: int

    @property
    def key(self) -> str:
        return f"{self.path}:{self.name}"

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} ({self.length} lines)"


def python_files(root: Path, folders: tuple[str, ...]) -> list[Path]:
    """The ``.py`` files under ``folders``; symlinked folders are not followed, so
    no file is read twice."""
    found = []
    for folder in folders:
        for where, dirs, files in os.walk(root / folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            found += [Path(where) / f for f in sorted(files) if f.endswith(".py")]
    return found


def functions(tree: ast.AST, prefix: str = ""):
    """Every function in ``tree`` with its qualified name, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def long_functions(root: Path, folders: tuple[str, ...] = FOLDERS, limit: int = LIMIT):
    """Every function over ``limit`` lines under ``folders``, in file order."""
    out = []
    for path in python_files(root, folders):
        tree = ast.parse(path.read_text(), filename=str(path))
        for name, node in functions(tree):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                out.append(Long(path.relative_to(root).as_posix(), node.lineno, name, length))
    return out


def problems(found: list[Long], allowed: dict[str, int], limit: int = LIMIT) -> list[str]:
    """What is wrong: a long function not allowed, an allowed one that grew, and an
    allowed entry that is stale (its function is gone or no longer too long)."""
    by_key = {f.key: f for f in found}
    out = [f"{f}: over {limit} lines" for f in found if f.key not in allowed]
    out += [
        f"{f}: grew past the {allowed[f.key]} lines it is allowed"
        for f in found
        if f.key in allowed and f.length > allowed[f.key]
    ]
    out += [
        f"{key}: allowed but now {limit} lines or less, or gone; remove it from ALLOWED"
        for key in allowed
        if key not in by_key
    ]
    return out


def test_no_source_function_is_over_60_lines():
    found = problems(long_functions(REPO), ALLOWED)
    assert not found, "\n".join(found)


def write(path: Path, body_lines: int, name: str = "f") -> None:
    """A module with one function of ``body_lines + 1`` lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines - 1))
    path.write_text(f"@decorated\ndef {name}():\n{body}    return 0\n")


def test_the_checker_counts_def_to_last_line_and_names_methods(tmp_path):
    write(tmp_path / "pkg" / "ok.py", 59)  # 60 lines: allowed
    write(tmp_path / "pkg" / "long.py", 60)  # 61 lines
    nested = tmp_path / "pkg" / "sub" / "nested.py"
    body = "".join(f"            y{i} = {i}\n" for i in range(62))
    nested.parent.mkdir(parents=True)
    nested.write_text(f"class C:\n    def m(self):\n        def inner():\n{body}")
    found = long_functions(tmp_path, ("pkg",))
    assert [str(f) for f in found] == [
        "pkg/long.py:2 f (61 lines)",
        "pkg/sub/nested.py:2 C.m (64 lines)",
        "pkg/sub/nested.py:3 C.m.inner (63 lines)",
    ]


def test_the_allow_list_only_shrinks():
    found = [Long("a.py", 1, "big", 70), Long("b.py", 5, "bigger", 90)]
    assert problems(found, {"a.py:big": 70, "b.py:bigger": 90}) == []
    assert problems(found, {"a.py:big": 70}) == ["b.py:5 bigger (90 lines): over 60 lines"]
    assert problems(found, {"a.py:big": 69, "b.py:bigger": 90}) == [
        "a.py:1 big (70 lines): grew past the 69 lines it is allowed"
    ]
    assert problems(found, {"a.py:big": 70, "b.py:bigger": 90, "c.py:gone": 80}) == [
        "c.py:gone: allowed but now 60 lines or less, or gone; remove it from ALLOWED"
    ]
