"""SlidingWindowPages: a holder's ``swa.kv`` window and the ``swa.window`` snapshots.

A sliding-window layer attends to the last W positions only, so a holder keeps
just the ``swa.kv`` pages that hold them, keyed by page index (page j holds
positions [j * ps, (j + 1) * ps))::

    positions   0 .......... computed - W ............ computed ..... allocated
    swa_pages              { j: id, ... pages that hold any of these ... }
                           ^ free_swa_behind drops pages wholly below here

A snapshot at boundary b freezes the window [b - W, b) into ``swa.window``
pages, zero-padded below position 0; a restore at d copies it back into the
holder's own pages for [d - W, d). Both directions copy: a snapshot and a
holder never share a page. Pages leave only through the store's exits, and
each freed page leaves the holder's table as it goes, so the table never
names a free page.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kvwatch.engine.cache.failpoints import Site
from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.storage import CacheStorage
from kvwatch.engine.config import SWA_KV, SWA_WINDOW, CacheConfig


class SlidingWindowPages:
    """The ``swa.kv`` group's window arithmetic and its ``swa.window`` snapshot copies.

    ``enabled`` is False for a backend whose holders keep no window (a model
    with full attention only): then no position needs a page.
    """

    group = SWA_KV
    snapshot_group = SWA_WINDOW

    def __init__(self, store: CacheStorage, config: CacheConfig, *, enabled: bool = True) -> None:
        self.store = store
        self.pools = store.pools
        self.window = config.window
        self.page_size = store.pools[SWA_KV].page_size
        self.enabled = enabled

    # -- which pages a holder needs --------------------------------------------------
    def page_range(self, start: int, end: int) -> range:
        """The page indices that hold positions [start, end)."""
        ps = self.page_size
        return range(start // ps, math.ceil(end / ps)) if end > start else range(0)

    def needed(self, start: int, end: int) -> range:
        """The page indices a holder keeps for positions [start, end) (none if disabled)."""
        return self.page_range(start, end) if self.enabled else range(0)

    def below(self, d: int) -> range:
        """The pages of the window a holder resuming at ``d`` starts with."""
        return self.needed(max(0, d - self.window), d)

    def missing(self, holder: Holder, start: int, end: int) -> list[int]:
        """Pages [start, end) needs that the holder does not have yet."""
        return [j for j in self.needed(start, end) if j not in holder.swa_pages]

    def give(self, holder: Holder, index: range, pages: np.ndarray) -> None:
        """A fresh table: ``pages`` at page indices ``index``."""
        holder.swa_pages = dict(zip(index, pages.tolist(), strict=True))

    def take(self, holder: Holder, index: list[int], pages: np.ndarray) -> None:
        """Add newly allocated pages at page indices ``index``."""
        holder.swa_pages.update(zip(index, pages.tolist(), strict=True))

    def cover(self, holder: Holder, b: int) -> None:
        """A restore writes the window below ``b``: make sure its swa.kv pages exist."""
        ps = self.page_size
        lo = max(0, b - self.window)
        missing = [j for j in range(lo // ps, math.ceil(b / ps)) if j not in holder.swa_pages]
        if missing:
            pages = self.store.alloc(SWA_KV, len(missing), holder.owner, site=Site.SESSION_WINDOW)
            holder.swa_pages.update(zip(missing, pages.tolist(), strict=True))

    # -- giving pages back -------------------------------------------------------------
    def free_swa_from(self, holder: Holder, start: int) -> None:
        """Free the holder's ``swa.kv`` pages whose first position is ``start`` or
        later (a trim, a session's tail), taking each out of ``holder.swa_pages``.

        A page is taken out of the holder's table as it is freed, so the table
        never names a free page and no page is freed twice. A page holding
        positions on both sides of ``start`` stays: it still holds live tokens.
        """
        ps = self.page_size
        tail = [j for j in holder.swa_pages if j * ps >= start]
        self.store.free_pages(SWA_KV, [holder.swa_pages.pop(j) for j in tail], holder.owner)

    def free_swa_behind(self, holder: Holder, cutoff: int) -> None:
        """Free the holder's ``swa.kv`` pages whose every position is below
        ``cutoff`` (fallen out of the sliding window), taking each out of
        ``holder.swa_pages``, as ``free_swa_from`` does at the other end."""
        ps = self.page_size
        dead = [j for j in holder.swa_pages if (j + 1) * ps <= cutoff]
        self.store.free_pages(SWA_KV, [holder.swa_pages.pop(j) for j in dead], holder.owner)

    def free_all(self, holder: Holder) -> None:
        """Give back the whole window and empty the holder's table."""
        self.store.free_pages(SWA_KV, list(holder.swa_pages.values()), holder.owner)
        holder.swa_pages = {}

    # -- reading and writing the window ------------------------------------------------
    def table(self, holder: Holder) -> dict[int, int]:
        return holder.swa_pages

    def locate(self, holder: Holder, start: int, n: int) -> tuple[list[int], int]:
        """Pages and in-page offset that hold ``swa.kv`` positions [start, start + n)."""
        ps = self.page_size
        pages = [holder.swa_pages[j] for j in self.page_range(start - start % ps, start + n)]
        return pages, start % ps

    def write_snapshot(self, holder: Holder, pages: dict[str, np.ndarray], b: int) -> None:
        """Write the window at ``b`` into snapshot pages: the last W tokens of
        ``swa.kv``, zero-padded below position 0."""
        w = self.window
        n = min(b, w)
        window = self.pools[SWA_WINDOW]
        if n < w:
            pad = torch.zeros((w - n, *window.layout.token_shape), dtype=window.layout.dtype)
            window.write_tokens(pages[SWA_WINDOW], 0, pad)
        window.write_tokens(pages[SWA_WINDOW], w - n, self._read(holder, b - n, n))

    def restore(self, holder: Holder, snapshot: dict[str, np.ndarray], d: int) -> None:
        """Copy a snapshot's window at ``d`` into the holder's ``swa.kv`` positions
        [d - W, d), whose pages the holder already has."""
        first = max(0, d - self.window)
        n = d - first
        window = self.pools[SWA_WINDOW].read_tokens(snapshot[SWA_WINDOW], self.window - n, n)
        self._write(holder, first, window)

    def _read(self, holder: Holder, start: int, n: int) -> torch.Tensor:
        pages, offset = self.locate(holder, start, n)
        return self.pools[SWA_KV].read_tokens(pages, offset, n)

    def _write(self, holder: Holder, start: int, values: torch.Tensor) -> None:
        pages, offset = self.locate(holder, start, values.shape[0])
        self.pools[SWA_KV].write_tokens(pages, offset, values)
