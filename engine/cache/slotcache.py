"""The ``slots`` backend's page work: restore, stage, confirm, abort, evict.

``SlotTable`` (slots.py) decides; this module moves pages. A snapshot is a
whole-state copy, so a slot shares nothing with a holder::

    holder at boundary b      full.kv [0, b)  ──copy──►  slot pages (owner "slot i")
                              swa.kv  [b-W, b) ─copy──►  one swa.window snapshot
                              working linear ──copy──►  one linear.state page

and restoring copies the other way into the holder's own fresh pages. The
staged copy is taken when the runner crosses ``b`` and belongs to the holder
(a ``SLOT`` pending) until the request finishes: confirm moves it into the
slot, every other ending frees it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from kvwatch.engine.cache.holder import Holder, HolderStatus, Pending, PendingKind
from kvwatch.engine.cache.node import Tier
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.pool import PoolExhausted
from kvwatch.engine.cache.slots import Slot
from kvwatch.engine.config import FULL_KV, LINEAR_STATE, STATE_GROUPS, SWA_KV
from kvwatch.engine.events import (
    SlotAborted,
    SlotConfirmed,
    SlotEvicted,
    SlotMissed,
    SlotPrepared,
    SlotRestored,
)

if TYPE_CHECKING:
    from kvwatch.engine.cache.hybrid import HybridPrefixCache


def slot_owner(index: int) -> Owner:
    return Owner(OwnerKind.SLOT, index)


def start(cache: HybridPrefixCache, holder: Holder) -> int:
    """Look the prompt up, restore the slot if it validates, and prepare a snapshot.

    Returns the restored length (0 on a miss). Raises ``PoolExhausted``
    holding nothing when the holder's pages cannot be allocated.
    """
    table = cache.slots
    tokens, limit, extra = holder.tokens, len(holder.tokens) - 1, holder.extra_key
    slot: Slot | None = None
    if (entry := table.lookup(tokens, limit, extra)) is not None:
        reason = table.check(entry, tokens, limit, extra)
        if reason is None:
            slot = table.slots[entry.slot]
        else:
            cache.events.emit(SlotMissed(holder.id, entry.slot, reason))
    d = slot.length if slot is not None else 0
    if slot is not None:
        table.pinned.add(slot.index)  # making room for the copy must not evict its source
    try:
        _activate(cache, holder, d)
    finally:
        table.pinned.clear()
    if slot is not None:
        full = cache.pools[FULL_KV]
        full.copy_pages(slot.pages[FULL_KV], full, np.asarray(holder.full_pages))
        cache.restore_state(holder, slot.pages, d)
        table.tick(slot)
        cache.events.emit(SlotRestored(holder.id, slot.index, d))
    else:
        cache.restore_state(holder, None, 0)
    _prepare(cache, holder, d)
    return d


def _activate(cache: HybridPrefixCache, holder: Holder, d: int) -> None:
    """Own pages for [0, d) of full.kv, the window below d, and a working state."""
    swa_idx = cache.swa_page_range(max(0, d - cache.config.window), d)
    counts = {LINEAR_STATE: 1, SWA_KV: len(swa_idx), FULL_KV: math.ceil(d / cache.page_size)}
    got = cache.alloc_groups(counts, holder.owner)
    holder.working = {LINEAR_STATE: got[LINEAR_STATE]}
    holder.swa_pages = dict(zip(swa_idx, got[SWA_KV].tolist(), strict=True))
    holder.full_pages = got[FULL_KV].tolist()
    holder.lock_node = None
    holder.cached_len = 0  # nothing is borrowed: the restored prefix is the holder's own copy
    holder.computed_len = holder.allocated_len = d
    holder.status = HolderStatus.ACTIVE


def _prepare(cache: HybridPrefixCache, holder: Holder, restored: int) -> None:
    """Reserve a slot for a snapshot at the prompt's last turn boundary.

    Nothing to do when the boundary is already behind us, or when an entry
    already claims that very prefix. A boundary shorter than
    ``slot_min_tokens`` is degenerate: the snapshot aborts at once, and the
    slot counter has moved all the same.
    """
    b = holder.snapshot_at
    if b is None or b <= restored or holder.owner.kind is OwnerKind.SESSION:
        return
    table = cache.slots
    if table.has(table.key(holder.tokens, b, holder.extra_key)):
        return
    ticket = table.prepare(holder.tokens, b, holder.extra_key)
    cache.events.emit(SlotPrepared(holder.id, ticket.slot, b))
    if b < cache.config.slot_min_tokens:
        cache.events.emit(SlotAborted(holder.id, ticket.slot, "degenerate boundary"))
        return
    holder.slot_ticket = ticket


def capture_points(holder: Holder, start: int, end: int) -> list[tuple[int, PendingKind]]:
    ticket = holder.slot_ticket
    if ticket is not None and start < ticket.boundary <= end:
        return [(ticket.boundary, PendingKind.SLOT)]
    return []


def capture(cache: HybridPrefixCache, holder: Holder, boundary: int, linear_state) -> None:
    """Stage the whole state at ``boundary`` in pages the holder owns until confirm."""
    n_full = math.ceil(boundary / cache.page_size)
    counts = {g: cache.config.pages_per_snapshot(g) for g in STATE_GROUPS}
    try:
        pages = cache.alloc_groups({FULL_KV: n_full, **counts}, holder.owner)
    except PoolExhausted:
        abort(cache, holder, "no room")
        return
    full = cache.pools[FULL_KV]
    full.copy_pages(np.asarray(holder.full_pages[:n_full]), full, pages[FULL_KV])
    cache.write_snapshot(holder, pages, boundary, linear_state)
    holder.pending[boundary] = Pending(boundary, pages, PendingKind.SLOT)


def _staged(holder: Holder) -> Pending | None:
    ticket = holder.slot_ticket
    pend = holder.pending.get(ticket.boundary) if ticket is not None else None
    return pend if pend is not None and pend.kind is PendingKind.SLOT else None


def confirm(cache: HybridPrefixCache, holder: Holder) -> None:
    """The request finished: its staged snapshot becomes the slot's contents."""
    ticket = holder.slot_ticket
    if ticket is None:
        return
    pend = _staged(holder)
    if pend is None:
        abort(cache, holder, "boundary not reached")
        return
    del holder.pending[ticket.boundary]
    holder.slot_ticket = None
    owner = slot_owner(ticket.slot)
    for group, ids in pend.pages.items():
        cache.pools[group].transfer(ids, holder.owner, owner)
    old, erased = cache.slots.confirm(ticket, pend.pages)
    cache.free_groups(old, owner, Tier.DEVICE)
    cache.events.emit(SlotConfirmed(holder.id, ticket.slot, ticket.boundary, erased))


def abort(cache: HybridPrefixCache, holder: Holder, reason: str) -> None:
    """Give up a prepared snapshot; its slot step stays burned."""
    ticket = holder.slot_ticket
    if ticket is None:
        return
    if (pend := _staged(holder)) is not None:
        del holder.pending[ticket.boundary]
        cache.free_groups(pend.pages, holder.owner, Tier.DEVICE)
    holder.slot_ticket = None
    cache.events.emit(SlotAborted(holder.id, ticket.slot, reason))


def make_room(cache: HybridPrefixCache, group: str, wanted: int) -> int:
    """Empty least recently used slots until ``wanted`` pages of ``group`` are free."""
    table, got = cache.slots, 0
    for slot in sorted(table.slots, key=lambda s: s.last_use):
        if got >= wanted:
            break
        if slot.empty or slot.index in table.pinned or group not in slot.pages:
            continue
        got += len(slot.pages[group])
        _evict(cache, slot, "pressure")
    return got


def flush(cache: HybridPrefixCache) -> None:
    for slot in cache.slots.slots:
        if not slot.empty:
            _evict(cache, slot, "flush")


def _evict(cache: HybridPrefixCache, slot: Slot, reason: str) -> None:
    length = slot.length
    pages = cache.slots.clear(slot.index)
    cache.free_groups(pages, slot_owner(slot.index), Tier.DEVICE)
    cache.events.emit(SlotEvicted(slot.index, length, reason))
