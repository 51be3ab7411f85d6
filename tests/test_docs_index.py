"""docs/README.md indexes every document in docs/: a reader finds each one there,
with what it shows and how it is made."""

from __future__ import annotations

import re

from paths import REPO

DOCS = REPO / "docs"


def unindexed(index: str, names: list[str]) -> list[str]:
    """The names no backticked entry of ``index`` mentions (a folder entry, ``real-bugs/``,
    covers what lies in it)."""
    entries = set(re.findall(r"`([^`]+)`", index))
    return [n for n in names if n not in entries and f"{n.split('/')[0]}/" not in entries]


def test_every_document_in_docs_is_in_its_index():
    names = sorted(
        p.relative_to(DOCS).as_posix()
        for p in DOCS.rglob("*")
        if p.is_file() and p.name != "README.md"
    )
    assert names
    assert unindexed((DOCS / "README.md").read_text(), names) == []


def test_a_document_left_out_of_the_index_is_named():
    index = "| `a.md`, `a.json` | ... |\n| `scripts/` | ... |"
    assert unindexed(index, ["a.md", "a.json", "b.md", "scripts/x.py"]) == ["b.md"]
