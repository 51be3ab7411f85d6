"""The backend for each ``PrefixCacheMode``, chosen once, at construction.

    radix  ─► RadixPrefixCache   a radix tree with state recovery (radix_backend.py)
    slots  ─► SlotPrefixCache    whole-state snapshot slots (slot_backend.py)
    off    ─► NoPrefixCache      nothing shared: every request computes from 0

Nothing outside a backend's own module asks which mode it runs in.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from kvwatch.engine.cache.base import CacheBase
from kvwatch.engine.cache.deferred import mutation
from kvwatch.engine.cache.holder import HolderStatus, PendingKind
from kvwatch.engine.cache.pool import PageLayout
from kvwatch.engine.cache.protocol import Handle, Match
from kvwatch.engine.cache.radix_backend import RadixPrefixCache
from kvwatch.engine.cache.slot_backend import SlotPrefixCache
from kvwatch.engine.config import CacheConfig, PrefixCacheMode
from kvwatch.engine.events import EventBus
from kvwatch.engine.faults import Fault


class NoPrefixCache(CacheBase):
    """The cache-off baseline: holders own every page they compute."""

    @mutation
    def match(self, h: Handle) -> Match:
        holder = self._matchable(h)
        self._pages.give_working(holder, 0)
        holder.lock_node = None
        holder.cached_len = holder.computed_len = holder.allocated_len = 0
        holder.status = HolderStatus.ACTIVE
        self._pages.restore(holder, None, 0)
        return Match(0, 0)

    def capture_points(self, h: Handle, start: int, end: int) -> list[tuple[int, PendingKind]]:
        return []


BACKENDS: dict[PrefixCacheMode, type[CacheBase]] = {
    PrefixCacheMode.RADIX: RadixPrefixCache,
    PrefixCacheMode.SLOTS: SlotPrefixCache,
    PrefixCacheMode.OFF: NoPrefixCache,
}


def build_cache(
    config: CacheConfig,
    layouts: Mapping[str, PageLayout] | None = None,
    *,
    faults: frozenset[Fault] = frozenset(),
    device: str | torch.device = "cpu",
    events: EventBus | None = None,
    fingerprint: str = "",
) -> CacheBase:
    """The backend ``config.mode`` names. ``fingerprint`` (the model and its
    geometry) keys the slot backend's entries; the others ignore it."""
    backend = BACKENDS[config.mode]
    return backend(
        config, layouts, faults=faults, device=device, events=events, fingerprint=fingerprint
    )
