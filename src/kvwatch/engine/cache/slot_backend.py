"""SlotPrefixCache: the snapshot-slot backend (``mode=slots``, seed 004).

``SlotTable`` (slots.py) decides; this backend moves pages. The tree stays
empty. A snapshot is a
whole-state copy, so a slot shares nothing with a holder::

    holder at boundary b      full.kv [0, b)  ──copy──►  slot pages (owner "slot i")
                              swa.kv  [b-W, b) ─copy──►  one swa.window snapshot
                              working linear ──copy──►  one linear.state page

and restoring copies the other way into the holder's own fresh pages. The
staged copy is taken when the runner crosses ``b`` and belongs to the holder
(a ``SLOT`` pending) until the request finishes: confirm moves it into the
slot, every other ending frees it. ``SlotReads`` shows the readers the
slots (their pages, the table's findings, what pressure may take back).
"""

from __future__ import annotations

from kvwatch.contracts import Finding, SlotReport
from kvwatch.engine.cache.base import CacheBase
from kvwatch.engine.cache.claims import Claims
from kvwatch.engine.cache.deferred import mutation
from kvwatch.engine.cache.failpoints import Site
from kvwatch.engine.cache.holder import Holder, HolderStatus, Pending, PendingKind
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.pool import PoolExhausted
from kvwatch.engine.cache.protocol import Capture, Handle, Match, holder_of
from kvwatch.engine.cache.slots import Slot, SlotTable
from kvwatch.engine.cache.view import StoredReads
from kvwatch.engine.events import (
    SlotAborted,
    SlotConfirmed,
    SlotEvicted,
    SlotMissed,
    SlotPrepared,
    SlotRestored,
)


def slot_owner(index: int) -> Owner:
    return Owner(OwnerKind.SLOT, index)


class SlotPrefixCache(CacheBase):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._slots = SlotTable(self._config.slots, self._fingerprint, self._faults)
        self._stored = SlotReads(self._slots)
        self._store.reclaimers.append(self._reclaim)

    # -- match: restore a slot, prepare the next snapshot --------------------------------
    @mutation
    def match(self, h: Handle) -> Match:
        """Look the prompt up, restore the slot if it validates, and prepare a snapshot.

        Returns the restored length (0 on a miss) as both hit and resume.
        Raises ``PoolExhausted`` holding nothing when the holder's pages
        cannot be allocated.
        """
        holder = self._matchable(h)
        slot = self._lookup(holder)
        d = slot.length if slot is not None else 0
        if slot is not None:
            self._slots.pinned.add(slot.index)  # making room for the copy must not evict its source
        try:
            self._activate(holder, d)
        finally:
            self._slots.pinned.clear()
        if slot is not None:
            self._pages.full.copy_in(holder, slot.pages)
            self._pages.restore(holder, slot.pages, d)
            self._slots.tick(slot)
            self._events.emit(SlotRestored(holder.id, slot.index, d))
        else:
            self._pages.restore(holder, None, 0)
        self._prepare(holder, d)
        return Match(d, d)

    def _lookup(self, holder: Holder) -> Slot | None:
        table = self._slots
        tokens, limit, extra = holder.tokens, len(holder.tokens) - 1, holder.extra_key
        if (entry := table.lookup(tokens, limit, extra)) is None:
            return None
        reason = table.check(entry, tokens, limit, extra)
        if reason is not None:
            self._events.emit(SlotMissed(holder.id, entry.slot, reason))
            return None
        return table.slots[entry.slot]

    def _activate(self, holder: Holder, d: int) -> None:
        """Own pages for [0, d) of full.kv, the window below d, and a working state."""
        site = Site.SLOT_RESTORE if d else Site.ADMIT_WORKING
        self._pages.give_working(holder, d, full_pages=self._pages.full.pages_for(d), site=site)
        holder.lock_node = None
        holder.cached_len = 0  # nothing is borrowed: the restored prefix is the holder's own copy
        holder.computed_len = holder.allocated_len = d
        holder.status = HolderStatus.ACTIVE

    def _prepare(self, holder: Holder, restored: int) -> None:
        """Reserve a slot for a snapshot at the prompt's last turn boundary.

        Nothing to do when the boundary is already behind us, or when an entry
        already claims that very prefix. A boundary shorter than
        ``slot_min_tokens`` is degenerate: the snapshot aborts at once, and the
        slot counter has moved all the same.
        """
        b = holder.snapshot_at
        if b is None or b <= restored or holder.owner.kind is OwnerKind.SESSION:
            return
        table = self._slots
        if table.has(table.key(holder.tokens, b, holder.extra_key)):
            return
        ticket = table.prepare(holder.tokens, b, holder.extra_key)
        self._events.emit(SlotPrepared(holder.id, ticket.slot, b))
        if b < self._config.slot_min_tokens:
            self._events.emit(SlotAborted(holder.id, ticket.slot, "degenerate boundary"))
            return
        holder.slot_ticket = ticket

    # -- staging, confirm, abort -----------------------------------------------------------
    def capture_points(self, h: Handle, start: int, end: int) -> list[tuple[int, PendingKind]]:
        """One point: the prepared turn boundary, when this range crosses it."""
        ticket = holder_of(h).slot_ticket
        if ticket is not None and start < ticket.boundary <= end:
            return [(ticket.boundary, PendingKind.SLOT)]
        return []

    def _capture(self, holder: Holder, cap: Capture) -> None:
        """Stage the whole state at the boundary in pages the holder owns until confirm."""
        full = self._pages.full
        n_full = full.pages_for(cap.boundary)
        counts = self._pages.snapshot_counts()
        try:
            pages = self._store.alloc_groups(
                {full.group: n_full, **counts}, holder.owner, site=Site.SLOT_STAGE
            )
        except PoolExhausted:
            self._abort(holder, "no room")
            return
        full.copy_out(holder, pages, n_full)
        self._pages.write_snapshot(holder, pages, cap.boundary, cap.linear_state)
        holder.pending[cap.boundary] = Pending(cap.boundary, pages, PendingKind.SLOT)

    def _finish(self, holder: Holder) -> None:
        """The request finished: its staged snapshot becomes the slot's contents."""
        ticket = holder.slot_ticket
        if ticket is None:
            return
        pend = _staged(holder)
        if pend is None:
            self._abort(holder, "boundary not reached")
            return
        del holder.pending[ticket.boundary]
        holder.slot_ticket = None
        owner = slot_owner(ticket.slot)
        for group, ids in pend.pages.items():
            self._store.transfer_pages(group, ids, holder.owner, owner)
        old, erased = self._slots.confirm(ticket, pend.pages)
        self._store.free_groups(old, owner, Tier.DEVICE)
        self._events.emit(
            SlotConfirmed(
                holder_id=holder.id, slot=ticket.slot, length=ticket.boundary, stale_erased=erased
            )
        )

    def _abort(self, holder: Holder, reason: str) -> None:
        """Give up a prepared snapshot; its slot step stays burned."""
        ticket = holder.slot_ticket
        if ticket is None:
            return
        if (pend := _staged(holder)) is not None:
            del holder.pending[ticket.boundary]
            self._store.free_groups(pend.pages, holder.owner, Tier.DEVICE)
        holder.slot_ticket = None
        self._events.emit(SlotAborted(holder.id, ticket.slot, reason))

    def _retract_anchor(self, holder: Holder) -> Node | None:
        self._abort(holder, "retracted")
        return None

    # -- pressure and flush ------------------------------------------------------------------
    def _reclaim(self, group: str, wanted: int, tier: Tier) -> int:
        """Empty least recently used slots until ``wanted`` pages of ``group`` are free."""
        if tier is not Tier.DEVICE:
            return 0
        got = 0
        for slot in sorted(self._slots.slots, key=lambda s: s.last_use):
            if got >= wanted:
                break
            if slot.empty or slot.index in self._slots.pinned or group not in slot.pages:
                continue
            got += len(slot.pages[group])
            self._evict(slot, "pressure")
        return got

    @mutation
    def flush(self) -> None:
        self._store.flush()
        for slot in self._slots.slots:
            if not slot.empty:
                self._evict(slot, "flush")

    def _evict(self, slot: Slot, reason: str) -> None:
        length = slot.length
        pages = self._slots.clear(slot.index)
        self._store.free_groups(pages, slot_owner(slot.index), Tier.DEVICE)
        self._events.emit(SlotEvicted(slot.index, length, reason))


class SlotReads(StoredReads):
    """The slots as the readers see them: their pages, the table's own findings,
    what pressure may take back, and the figures a probe reports."""

    def __init__(self, table: SlotTable) -> None:
        self._table = table

    def claim(self, claims: Claims) -> None:
        for slot in self._table.slots:
            me = claims.register(slot_owner(slot.index), slot)
            for group, ids in slot.pages.items():
                claims.add(group, Tier.DEVICE, ids, me)

    def findings(self) -> list[Finding]:
        return list(self._table.findings())

    def evictable(self) -> dict[str, int]:
        """Every filled slot but those being restored from: what ``_reclaim`` and
        ``flush`` take back."""
        out: dict[str, int] = {}
        for slot in self._table.slots:
            if not slot.empty and slot.index not in self._table.pinned:
                for group, ids in slot.pages.items():
                    out[group] = out.get(group, 0) + len(ids)
        return out

    def snapshots(self) -> list[Slot]:
        return [s for s in self._table.slots if not s.empty]

    def slot_report(self) -> SlotReport:
        table = self._table
        lengths = tuple(s.length for s in table.slots)
        filled = sum(not s.empty for s in table.slots)
        return SlotReport(
            slots=len(lengths),
            filled=filled,
            entries=len(table.entries),
            next_slot=table.next_slot,
            lengths=lengths,
        )


def _staged(holder: Holder) -> Pending | None:
    ticket = holder.slot_ticket
    pend = holder.pending.get(ticket.boundary) if ticket is not None else None
    return pend if pend is not None and pend.kind is PendingKind.SLOT else None
