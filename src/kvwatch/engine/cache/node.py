"""Radix-tree nodes and the continuation snapshots they may carry.

A node covers a page-aligned run of tokens below its parent::

    root ──[0, 64)──► A ──[64, 96)──► B          depth(B) = 96
                       └─[64, 128)──► C          (tokens differ at 64)

``pages[k]`` is the ``full.kv`` page that holds tokens
``[depth - len(tokens) + k*P, ... + P)``. A node's snapshot, when present, is the
state of the S and L layers *at the node's end* (``depth``): with it a request
can resume at ``depth`` without recomputing anything before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum

import numpy as np

from kvwatch.engine.config import STATE_GROUPS

EMPTY_PAGES = np.empty(0, dtype=np.int64)
_ALL_STATE_GROUPS = frozenset(STATE_GROUPS)


class Tier(StrEnum):
    DEVICE = "device"
    HOST = "host"


class Snapshot:
    """State pages of one node boundary, one entry per state group.

    A snapshot whose state groups were released keeps an empty record: the node
    is then a *history-only anchor*. Adoption at commit refills or skips it.
    """

    __slots__ = ("pages", "tier")

    def __init__(self, pages: dict[str, np.ndarray], tier: Tier = Tier.DEVICE) -> None:
        self.pages = pages
        self.tier = tier

    @property
    def complete(self) -> bool:
        return self.pages.keys() >= _ALL_STATE_GROUPS

    @property
    def history_only(self) -> bool:
        return not self.pages

    def __repr__(self) -> str:
        groups = {g: p.tolist() for g, p in self.pages.items()}
        return f"Snapshot({groups}, tier={self.tier})"


class Node:
    __slots__ = (
        "children",
        "depth",
        "extra_key",
        "host_refs",
        "id",
        "key",
        "last_access",
        "pages",
        "parent",
        "refs",
        "snapshot",
        "tokens",
    )

    def __init__(
        self,
        node_id: int,
        parent: Node | None,
        tokens: list[int],
        pages: np.ndarray,
        extra_key: str | None,
        last_access: int,
    ) -> None:
        self.id = node_id
        self.parent = parent
        self.tokens = tokens
        self.pages = pages
        self.extra_key = extra_key
        # the key its parent lists it under: (extra_key, *first page of tokens),
        # set by RadixTree.link, the one place a node is linked below a parent
        self.key: tuple = ()
        self.children: dict[tuple, Node] = {}
        self.depth = (parent.depth if parent else 0) + len(tokens)
        self.refs = 0  # device holders whose locked path runs through this node
        self.host_refs = 0  # retracted holders that will recover from this node
        self.snapshot: Snapshot | None = None
        self.last_access = last_access

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def start(self) -> int:
        return self.depth - len(self.tokens)

    @property
    def has_complete_snapshot(self) -> bool:
        return self.snapshot is not None and self.snapshot.complete

    def path(self) -> Iterator[Node]:
        """This node, then each ancestor up to and including the root."""
        node: Node | None = self
        while node is not None:
            yield node
            node = node.parent

    def __repr__(self) -> str:
        return (
            f"Node(id={self.id}, depth={self.depth}, refs={self.refs}, host_refs={self.host_refs})"
        )
