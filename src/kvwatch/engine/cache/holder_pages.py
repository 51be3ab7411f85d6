"""HolderPages: a holder's pages across the cache groups, in one fixed order.

Each group family has its own class, which alone knows that group's page
arithmetic and the holder table it fills::

    HolderPages ──► FullAttentionPages   full.kv       full_pages: page k = [kP, (k+1)P)
                ├─► SlidingWindowPages   swa.kv        swa_pages: the last W positions
                │                        swa.window    (its snapshots)
                └─► LinearStatePages     linear.state  working: one recurrent state

This class composes them: an operation over several groups asks each family
what it needs, allocates all of it in one ``alloc_groups`` call (all or
nothing; the dict's order is the order the groups are taken in, and so which
one a failpoint or a shortage fails), then hands each family its pages. The
order is part of the behaviour: ``linear.state``, ``swa.kv``, ``full.kv`` at
admission, ``full.kv`` then ``swa.kv`` for a chunk, the snapshot groups as
``STATE_GROUPS`` lists them.
"""

from __future__ import annotations

import numpy as np
import torch

from kvwatch.engine.cache.failpoints import Site
from kvwatch.engine.cache.full_attention import FullAttentionPages
from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.linear_state import LinearStatePages
from kvwatch.engine.cache.protocol import PageTable
from kvwatch.engine.cache.sliding_window import SlidingWindowPages
from kvwatch.engine.cache.storage import CacheStorage
from kvwatch.engine.config import CacheConfig


class HolderPages:
    """The per-group families of one cache, and the operations that span them.

    ``keeps_state`` False: holders keep no working state and no window (a
    full-attention model); only ``full.kv`` pages are taken.
    """

    def __init__(self, store: CacheStorage, config: CacheConfig, *, keeps_state: bool) -> None:
        self.store = store
        self.config = config
        self.full = FullAttentionPages(store)
        self.window = SlidingWindowPages(store, config, enabled=keeps_state)
        self.linear = LinearStatePages(store, enabled=keeps_state)
        # the groups a continuation snapshot holds, in STATE_GROUPS order
        self.snapshot_groups = (self.window.snapshot_group, self.linear.group)

    def give_working(
        self, holder: Holder, d: int, full_pages: int = 0, *, site: Site = Site.ADMIT_WORKING
    ) -> None:
        """A working state, the window below ``d`` and ``full_pages`` own full.kv pages."""
        swa_idx = self.window.below(d)
        counts = {
            self.linear.group: self.linear.count(),
            self.window.group: len(swa_idx),
            self.full.group: full_pages,
        }
        got = self.store.alloc_groups(counts, holder.owner, site=site)
        self.linear.give(holder, got[self.linear.group])
        self.window.give(holder, swa_idx, got[self.window.group])
        self.full.give(holder, got[self.full.group])

    def allocate(self, holder: Holder, n: int, *, site: Site) -> None:
        """Pages for tokens [allocated_len, allocated_len + n) in full.kv and swa.kv."""
        start, end = holder.allocated_len, holder.allocated_len + n
        need_full = self.full.need(holder, end)
        swa_idx = self.window.missing(holder, start, end)
        counts = {self.full.group: need_full, self.window.group: len(swa_idx)}
        got = self.store.alloc_groups(counts, holder.owner, site=site)
        self.full.take(holder, got[self.full.group])
        self.window.take(holder, swa_idx, got[self.window.group])
        holder.allocated_len = end

    def snapshot_counts(self) -> dict[str, int]:
        """Pages one continuation snapshot takes, by state group."""
        return {g: self.config.pages_per_snapshot(g) for g in self.snapshot_groups}

    def write_snapshot(
        self, holder: Holder, pages: dict[str, np.ndarray], b: int, linear_state: torch.Tensor
    ) -> None:
        """Freeze the holder's state at ``b`` into snapshot pages (copies)."""
        self.window.write_snapshot(holder, pages, b)
        self.linear.write_snapshot(pages, linear_state)

    def restore(self, holder: Holder, snapshot: dict[str, np.ndarray] | None, d: int) -> None:
        """Copy a device snapshot taken at ``d`` into the holder's own working pages.

        ``None`` is the state before any token: all zeros (no window to write).
        """
        if snapshot is None:
            self.linear.reset(holder)
            return
        self.linear.restore(holder, snapshot)
        self.window.restore(holder, snapshot, d)

    def trim(self, holder: Holder, keep_len: int) -> None:
        """Free what was allocated past ``keep_len``: full.kv pages past the one that
        still holds accepted tokens, and the swa.kv pages that start at or after it."""
        self.full.trim(holder, keep_len)
        self.window.free_swa_from(holder, keep_len)

    def free_all(self, holder: Holder) -> None:
        """Give back every page the holder owns in every group (not its snapshots),
        leaving its page tables empty."""
        self.full.free_own(holder)
        self.window.free_all(holder)
        self.linear.free_working(holder)

    def page_table(self, holder: Holder) -> PageTable:
        """Where the holder's tokens live, for the model."""
        return PageTable(
            self.full.table(holder), self.window.table(holder), self.linear.entry(holder)
        )
