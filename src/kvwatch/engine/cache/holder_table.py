"""HolderTable: the holders one cache gave handles to, and the one way to empty one.

``records`` maps holder id to ``Holder``, in the order they were opened (the
session slots' "held longest" is the first parked one found). ``open`` adds a
holder and hands out its ``Handle``; ``drop_everything`` empties a holder (its
lock, every page it owns, its pending snapshots) and then tells the backend
which path it left, so a snapshot it shared can be superseded now::

    drop_everything(holder)
        unlock lock_node's path ─► HolderPages.free_all ─► pending snapshots freed
        ─► lengths back to 0 ─► left_path(path)   (the backend's hook)

The cache's ``retract`` and ``release`` and the session slots' ``drop`` all
come through here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from kvwatch.engine.cache.holder import Handle, Holder
from kvwatch.engine.cache.holder_pages import HolderPages
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.storage import CacheStorage
from kvwatch.engine.cache.tree_events import acting


class HolderTable:
    """The records behind one cache's handles."""

    def __init__(
        self,
        store: CacheStorage,
        pages: HolderPages,
        left_path: Callable[[list[Node]], None],
    ) -> None:
        self.store = store
        self.pages = pages
        self.left_path = left_path
        self.records: dict[int, Holder] = {}
        self._ids = itertools.count(1)

    def open(
        self,
        tokens: list[int],
        *,
        extra_key: str | None,
        kind: OwnerKind,
        snapshot_at: int | None,
        label: str,
    ) -> Handle:
        """A NEW holder over ``tokens`` (the caller's list), and its handle."""
        hid = next(self._ids)
        owner = Owner(kind, hid)
        holder = Holder(
            id=hid,
            owner=owner,
            tokens=tokens,
            extra_key=extra_key,
            label=label,
            snapshot_at=snapshot_at,
        )
        holder.handle = Handle(holder)
        self.records[hid] = holder
        return holder.handle

    def drop_everything(self, holder: Holder, *, free_pending: bool = True) -> None:
        """Unlock the path and free every page the holder owns."""
        path = list(holder.lock_node.path()) if holder.lock_node is not None else []
        if holder.lock_node is not None:
            with acting(self.store.tree, holder.id, holder.label):
                self.store.tree.unlock(holder.lock_node)
        self.pages.free_all(holder)
        for pend in holder.pending.values() if free_pending else ():
            self.store.free_groups(pend.pages, holder.owner, Tier.DEVICE)
        holder.lock_node = None
        holder.pending = {}
        holder.cached_len = holder.computed_len = holder.allocated_len = 0
        if path:
            self.left_path(path)
