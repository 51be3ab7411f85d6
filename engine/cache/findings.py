"""Audit findings: the stable vocabulary shared by probes, detectors and CI."""

from __future__ import annotations

from typing import NamedTuple

ORPHAN = "orphan"  # allocated, but no live holder holds it
DOUBLE_OWNED = "double_owned"  # held twice, or held by someone other than its tag says
FREE_AND_OWNED = "free_and_owned"  # on the free stack while tagged or held
REF_MISMATCH = "ref_mismatch"  # a ref count differs from what live holders imply
TREE = "tree"  # a structure or counter invariant of the tree is broken
SLOT_TABLE = "slot_table"  # the slot cache's entries disagree with its slots

KINDS = (ORPHAN, DOUBLE_OWNED, FREE_AND_OWNED, REF_MISMATCH, TREE, SLOT_TABLE)
MAX_PAGES = 32  # evidence keeps the first page ids only; the detail says how many


class Finding(NamedTuple):
    kind: str
    group: str | None
    pages: tuple[int, ...]
    detail: str

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "group": self.group,
            "pages": list(self.pages),
            "detail": self.detail,
        }


def finding(kind: str, group: str | None, pages: list[int], detail: str) -> Finding:
    return Finding(kind, group, tuple(pages[:MAX_PAGES]), detail)
