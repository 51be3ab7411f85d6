"""``CacheWatch``: an engine's cache index and references, as a log a checker replays.

The history tier's ``index`` and ``references`` checks (``histories/cache_checks.py``)
read what a target's cache said and did, in order, not only its state at
barriers. A target that can tell it gives a ``CacheWatch``; its ``log`` holds:

* ``Stored(keys, blocks)`` / ``Removed(keys, blocks)`` / ``Cleared()``: the index's
  events, each block under its key (a digest of every token up to the block's
  end), as the engine told them;
* ``RefsMoved(holder, nodes, delta)``: a lookup's or commit's references taken
  (``+1``) or given back (``-1``) for a holder (``"ID:LABEL"``, the label a
  request or session id), and ``Split(node, upper)`` where the index copies a
  node's references onto a new node;
* ``RequestEnded(rid)``: a request ended (the loop said so);
* ``Seen(where, index, refs)``: the index (key -> block) and every node's
  reference count as the engine holds them now, after every step and at the end.

Invariant: a watch only listens and reads; it never changes the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar, NamedTuple

INDEX, REFERENCES = "index", "references"  # what a watch can tell: its checks


class Stored(NamedTuple):
    keys: tuple[int, ...]
    blocks: tuple[int, ...]


class Removed(NamedTuple):
    keys: tuple[int, ...]
    blocks: tuple[int, ...]


class Cleared(NamedTuple):
    """Every key is gone at once (a reset)."""


class RefsMoved(NamedTuple):
    holder: str
    nodes: tuple[int, ...]
    delta: int


class Split(NamedTuple):
    node: int
    upper: int


class RequestEnded(NamedTuple):
    rid: str


class Seen(NamedTuple):
    where: str  # "step N", "final"
    index: Mapping[int, int]  # key -> block
    refs: Mapping[int, int]  # node -> references, nodes with none left out


Entry = Stored | Removed | Cleared | RefsMoved | Split | RequestEnded | Seen


class CacheWatch(ABC):
    """A target's recorder of its cache's index and references (``log``, in order).
    ``tells``: which of the two it records (the other's check is skipped)."""

    tells: ClassVar[frozenset[str]] = frozenset({INDEX, REFERENCES})

    def __init__(self) -> None:
        self.log: list[Entry] = []

    @abstractmethod
    def look(self, where: str) -> None:
        """Append what the engine holds now (a ``Seen``)."""
