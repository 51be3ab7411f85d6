"""TreeEvents: what the radix tree tells listeners of its index and its refs.

Two streams, each complete enough to rebuild what it describes:

* the index, page by page: ``PagesStored`` when a node joins the tree with
  its pages, ``PagesRemoved`` when it leaves. Each page is named by its block
  key (``paths.block_keys``: a chained digest of every token up to the page's
  end), as a KV-aware router or a cache-event consumer would name it. A split
  changes no page's key and says nothing.
* the refs: ``RefsMoved(holder, node_ids, delta)`` for every change of
  ``node.refs``, made for the holder whose call is running (``acting``; ""
  outside any), and ``NodeSplit`` when a split copies a node's refs onto its
  new upper half.

Both are built only while someone listens (one ``listens`` per tree call), so
an engine nobody watches pays a dict lookup per change. ``index(tree)`` is the
index as the events name it, read from the tree itself, for a checker to hold
the two against each other::

    root ──[0, 8)──► A ──[8, 16)──► B        page size 4
    keys: A: k1 = key(base, t[0:4]), k2 = key(k1, t[4:8])
          B: k3 = key(k2, t[8:12]),  k4 = key(k3, t[12:16])
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from kvwatch.engine.events import EventBus, NodeSplit, PagesRemoved, PagesStored, RefsMoved
from kvwatch.engine.paths import block_keys, key_base

if TYPE_CHECKING:
    from kvwatch.engine.cache.node import Node


class _Tree(Protocol):  # ``RadixTree``, as this module reads it
    tell: TreeEvents | None
    page_size: int

    def nodes(self) -> list[Node]: ...


def node_keys(node: Node, page_size: int) -> tuple[int, ...]:
    """The block key of each of ``node``'s pages (its whole path read, root down)."""
    path = list(node.path())[-2::-1]  # root excluded, top-down, ending at node
    key = key_base(node.extra_key)
    keys: tuple[int, ...] = ()
    for n in path:
        keys = block_keys(key, n.tokens, page_size)
        key = keys[-1] if keys else key
    return keys


_UNHEARD = contextlib.nullcontext()  # reusable: what ``acting`` gives where nobody listens


def acting(tree: _Tree, holder_id: int, label: object) -> contextlib.AbstractContextManager:
    """A block whose ref changes are made for the holder (``"ID:LABEL"``, a label being
    a request or session id); nothing at all where nobody listens to ref changes."""
    tell = tree.tell
    if tell is None or not tell.bus.listens(RefsMoved):
        return _UNHEARD
    return tell.acting(f"{holder_id}:{label}")


def index(tree: _Tree) -> dict[int, int]:
    """Every page the tree holds, by its block key: what the index events describe."""
    out: dict[int, int] = {}
    for node in tree.nodes():
        if node.is_root:
            continue
        out.update(zip(node_keys(node, tree.page_size), node.pages.tolist(), strict=True))
    return out


class TreeEvents:
    """The tree's publisher: builds an event only for a type someone listens to."""

    def __init__(self, bus: EventBus, page_size: int) -> None:
        self.bus, self.page_size = bus, page_size
        self.actor = ""  # the holder the running call works for ("" outside any)

    @contextlib.contextmanager
    def acting(self, holder: str) -> Iterator[None]:
        """Ref changes inside the block are made for ``holder``."""
        before, self.actor = self.actor, holder
        try:
            yield
        finally:
            self.actor = before

    def stored(self, node: Node) -> None:
        if self.bus.listens(PagesStored):
            keys = node_keys(node, self.page_size)
            self.bus.emit(PagesStored(node.id, keys, tuple(node.pages.tolist())))

    def removed(self, node: Node) -> None:
        """Call while ``node`` is still linked (its keys are read along its path)."""
        if self.bus.listens(PagesRemoved):
            keys = node_keys(node, self.page_size)
            self.bus.emit(PagesRemoved(node.id, keys, tuple(node.pages.tolist())))

    def refs(self, nodes: Iterable[Node], delta: int) -> None:
        if self.bus.listens(RefsMoved):
            self.bus.emit(RefsMoved(self.actor, tuple(n.id for n in nodes), delta))

    def split(self, node: Node, upper: Node) -> None:
        if self.bus.listens(NodeSplit):
            self.bus.emit(NodeSplit(node.id, upper.id))
