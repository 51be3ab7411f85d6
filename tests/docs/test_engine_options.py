"""docs/engine-options.json and docs/engine-options.md: the options of each engine that
change what its KV cache stores or how, and whether kvwatch runs them.

Every row is complete; every covered row names kvwatch code that imports
(``module:attr.path``, ``NAME[key]`` a key of a mapping, ``Cls.field`` a field of a
dataclass or named tuple); the markdown holds the same rows, engine by engine.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from collections import Counter
from typing import Any

import pytest
from paths import REPO

JSON = REPO / "docs" / "engine-options.json"
MD = REPO / "docs" / "engine-options.md"
FIELDS = {"engine", "release", "option", "changes", "status", "where", "why"}
ENGINES = ("sglang", "vllm", "lightllm", "kvwatch")
STATUSES = ("covered", "not covered")
SEGMENT = re.compile(r"([A-Za-z_]\w*)((?:\[[^\]\[]+\])*)")
KEY = re.compile(r"\[([^\]\[]+)\]")


def rows() -> list[dict[str, str]]:
    return json.loads(JSON.read_text())


def field_names(cls: Any) -> tuple[str, ...] | None:
    """The fields of a dataclass or named-tuple class; None for anything else."""
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    if isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return tuple(cls._fields)
    return None


def resolve(where: str) -> None:
    """Import ``module`` and walk ``attr.path`` of ``module:attr.path``; raise if any
    step is missing. The last name of a path into a dataclass or named tuple must be
    one of its fields."""
    module_name, sep, path = where.partition(":")
    assert sep and path, f"{where!r} is not module:attribute"
    obj: Any = importlib.import_module(module_name)
    parts = path.split(".")
    for i, part in enumerate(parts):
        found = SEGMENT.fullmatch(part)
        assert found, f"{where!r}: cannot read {part!r}"
        name, subscripts = found.groups()
        fields = field_names(obj)
        if i == len(parts) - 1 and not subscripts and fields is not None:
            assert name in fields, f"{where!r}: {name} is not a field of {obj.__name__}"
            return
        obj = getattr(obj, name)
        for key in KEY.findall(subscripts):
            assert key in obj, f"{where!r}: no key {key!r}"
            obj = obj[key]


def sections(text: str) -> dict[str, str]:
    """Each engine's section of the markdown, by the engine named in its heading."""
    out = {}
    for chunk in text.split("\n## ")[1:]:
        heading = chunk.splitlines()[0]
        named = [e for e in ENGINES if heading.endswith(f"(`{e}`)")]
        assert len(named) == 1, f"heading {heading!r} names no single engine"
        out[named[0]] = chunk
    return out


def test_every_row_is_complete():
    data = rows()
    assert data
    for row in data:
        assert set(row) == FIELDS, row
        assert all(isinstance(v, str) for v in row.values()), row
        assert row["engine"] in ENGINES, row
        assert row["status"] in STATUSES, row
        for key in ("release", "option", "changes", "why"):
            assert row[key].strip(), (key, row)
        # a covered row says where; one not covered leaves it empty
        assert bool(row["where"]) == (row["status"] == "covered"), row
        # each value is one table cell of the markdown
        assert not any("|" in v or "\n" in v for v in row.values()), row


def test_options_are_unique_per_engine():
    repeated = Counter((r["engine"], r["option"]) for r in rows())
    assert [k for k, n in repeated.items() if n > 1] == []


def test_each_engine_has_rows_of_one_release():
    for engine in ENGINES:
        releases = {r["release"] for r in rows() if r["engine"] == engine}
        assert len(releases) == 1, (engine, releases)


@pytest.mark.parametrize(
    "where",
    sorted({r["where"] for r in rows() if r["status"] == "covered"}),
)
def test_covered_rows_name_code_that_exists(where):
    resolve(where)


def test_resolve_refuses_what_is_not_there():
    resolve("kvwatch.targets.sglang.loop_parts:LoopConfig.priority_scheduling")
    resolve("kvwatch.targets.sglang.histories:SETUPS[mamba]")
    resolve("kvwatch.targets.sglang.loop_parts:PoolConfig.page_size")
    for bad in (
        "kvwatch.targets.sglang.histories:SETUPS[no-such-setup]",
        "kvwatch.targets.sglang.loop_parts:LoopConfig.no_such_field",
        "kvwatch.targets.sglang.loop_parts:LoopConfig.__init__",  # not a field
        "kvwatch.targets.sglang.loop_parts:NoSuchName",
    ):
        with pytest.raises((AssertionError, AttributeError)):
            resolve(bad)


def test_markdown_holds_the_same_rows():
    text = MD.read_text()
    by_engine = sections(text)
    assert set(by_engine) == set(ENGINES)
    for engine, section in by_engine.items():
        mine = [r for r in rows() if r["engine"] == engine]
        table = [line for line in section.splitlines() if line.startswith("| `")]
        assert len(table) == len(mine), engine
        for row in mine:
            assert f"| `{row['option']}` | {row['status']} |" in section, (engine, row["option"])
        covered = sum(r["status"] == "covered" for r in mine)
        assert f"Covered: {covered}. Not covered: {len(mine) - covered}." in section, engine
