"""FullAttentionPages: a holder's ``full.kv`` pages, one per P tokens of its history.

Full attention keeps every token's K/V, so a holder's table is a plain list:
page k holds positions [kP, (k + 1)P). The prefix the holder borrowed from
the tree (its locked path's pages) comes first; the pages it owns follow::

    full_pages  [ borrowed: cached_len / P ][ own, computed ][ own, allocated ]
                                            ^ own_full_pages

Here: how many pages a length needs, taking and giving back a holder's own
pages (trim keeps a partly kept page), borrowing a path, handing computed
pages to the tree at commit and adopting the tree's copies, whole-table copies
for the slot backend, and auxiliary reads. Pages leave only through the
store's exits.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.node import Node
from kvwatch.engine.cache.radix import TREE_OWNER
from kvwatch.engine.cache.storage import CacheStorage
from kvwatch.engine.config import FULL_KV


class FullAttentionPages:
    """The ``full.kv`` group's page arithmetic over holders' tables."""

    group = FULL_KV

    def __init__(self, store: CacheStorage) -> None:
        self.store = store
        self.pool = store.pools[FULL_KV]
        self.page_size = store.page_size

    # -- a holder's own pages -------------------------------------------------------
    def pages_for(self, length: int) -> int:
        """Pages that hold positions [0, length)."""
        return math.ceil(length / self.page_size)

    def need(self, holder: Holder, end: int) -> int:
        """Pages the holder still needs for positions [0, end)."""
        return self.pages_for(end) - len(holder.full_pages)

    def give(self, holder: Holder, pages: np.ndarray) -> None:
        """A fresh table: ``pages`` (a match's own copy, or nothing)."""
        holder.full_pages = pages.tolist()

    def take(self, holder: Holder, pages: np.ndarray) -> None:
        """Append newly allocated pages to the holder's table."""
        holder.full_pages.extend(pages.tolist())

    def trim(self, holder: Holder, keep_len: int) -> None:
        """Free the pages past ``keep_len``; a partly kept page stays (it holds
        accepted tokens), and each freed page leaves the table."""
        keep_pages = math.ceil(keep_len / self.page_size)
        self.store.free_pages(FULL_KV, holder.full_pages[keep_pages:], holder.owner)
        del holder.full_pages[keep_pages:]

    def free_own(self, holder: Holder) -> None:
        """Give back every page the holder owns and empty its table; the borrowed
        prefix stays the tree's."""
        self.store.free_pages(FULL_KV, holder.own_full_pages(self.page_size), holder.owner)
        holder.full_pages = []

    def free_from(self, holder: Holder, first: int) -> None:
        """Give back the pages from index ``first`` on; the table still names them
        until ``forget_from`` (a session's tail: see ``SessionSlots.free_tail``)."""
        self.store.free_pages(FULL_KV, holder.full_pages[first:], holder.owner)

    def forget_from(self, holder: Holder, keep: int) -> None:
        """Take the pages from index ``keep`` on out of the holder's table."""
        del holder.full_pages[keep:]

    def table(self, holder: Holder) -> list[int]:
        return holder.full_pages

    def read_aux(self, holder: Holder, name: str) -> torch.Tensor:
        """The auxiliary field ``name`` of the holder's computed tokens."""
        return self.pool.read_aux(name, holder.full_pages, 0, holder.computed_len)

    # -- the tree's pages ---------------------------------------------------------------
    def borrow(self, holder: Holder, anchor: Node) -> None:
        """The anchor's path, root first, as the holder's table (borrowed, read-only)."""
        pages: list[int] = []
        for node in reversed(list(anchor.path())):
            pages += node.pages.tolist()
        holder.full_pages = pages

    def hand_to_tree(self, holder: Holder, pos: int, end: int) -> np.ndarray:
        """The holder's pages of [pos, end), now the tree's (they stay allocated)."""
        p = self.page_size
        pages = np.array(holder.full_pages[pos // p : end // p], dtype=np.int64)
        self.store.transfer_pages(FULL_KV, pages, holder.owner, TREE_OWNER)
        return pages

    def adopt(self, holder: Holder, node: Node, copies: list[int]) -> None:
        """Swap the holder's copies of ``node``'s pages for the tree's own; the
        copies join ``copies``, for the caller to free once its pass is over."""
        p = self.page_size
        a, b = node.start // p, node.depth // p
        tree_pages = node.pages.tolist()
        mine = holder.full_pages[a:b]
        if mine != tree_pages:
            copies += mine
            holder.full_pages[a:b] = tree_pages

    def free_copies(self, holder: Holder, copies: list[int]) -> None:
        """Free the duplicates ``adopt`` gathered (the holder owns each, once)."""
        self.store.free_pages(FULL_KV, copies, holder.owner)

    # -- whole copies (the slot backend) ----------------------------------------------
    def copy_in(self, holder: Holder, pages: dict[str, np.ndarray]) -> None:
        """Copy a stored snapshot's history into the holder's own pages."""
        self.pool.copy_pages(pages[FULL_KV], self.pool, np.asarray(holder.full_pages))

    def copy_out(self, holder: Holder, pages: dict[str, np.ndarray], n_full: int) -> None:
        """Copy the holder's first ``n_full`` pages into a staged snapshot's pages."""
        self.pool.copy_pages(np.asarray(holder.full_pages[:n_full]), self.pool, pages[FULL_KV])
