"""SessionSlots: streaming-session slots, kept between turns (seed 001).

Between turns the holder is PARKED: it keeps its lock on the prefix it
matched, its own pages (owner ``session``), its working state and its
turn-end snapshots. The next turn resumes from the slot without a tree lookup,
after freeing the tail the new turn would overwrite::

    positions   0 .... prefix_len ....... allocated_len
    full.kv     [ kept ][partial][ tail pages .... ]
                                 ^ free from ceil(prefix_len / P) on; the
                                   partial page still holds live tokens

The gap [prefix_len, allocated_len) has two sources: a turn's last verify
step allocated k + 1 slots and kept fewer (parking does not trim), and the
logit reserve, which resumes at most at len(tokens) - 1 so the last token is
computed again to yield logits (a retried turn, or a rollback). The linear
state cannot step backwards, so ``settle`` rewinds a slot whose computed
tokens outrun that limit to the deepest turn-end snapshot at or below it (a
slot keeps MAX_ROLLBACK + 1 of them), or failing that drops the slot so the
next turn matches the tree afresh. Closing is ``release(commit=True)``: the
session's tokens go into the tree.

A slot is also parked mid-turn (a retraction, a pause, an abort), so parking
says nothing about turn ends. A snapshot becomes a turn end only when the
session records one (``end_turn``, from ``Session.end_turn``): the turn ends a
rollback returns to are the session's, never a frontier some park left.

The cache owns one ``SessionSlots``; its public calls (``park``, ``end_turn``,
``resume``, ``settle``, ``drop_parked``) check the holder's status and
deliver events, then hand the holder here.
"""

from __future__ import annotations

from kvwatch.engine.cache.holder import Holder, HolderStatus, PendingKind
from kvwatch.engine.cache.holder_pages import HolderPages
from kvwatch.engine.cache.holder_table import HolderTable
from kvwatch.engine.cache.node import Tier
from kvwatch.engine.cache.pool import PoolExhausted
from kvwatch.engine.cache.storage import CacheStorage
from kvwatch.engine.config import MAX_ROLLBACK
from kvwatch.engine.faults import Fault


class SessionSlots:
    """Parked holders' slots over one cache's store, page families and holders
    (a slot is emptied the way every holder is: ``HolderTable.drop_everything``)."""

    def __init__(
        self,
        store: CacheStorage,
        pages: HolderPages,
        holders: HolderTable,
        faults: frozenset[Fault],
    ) -> None:
        self.store = store
        self.pages = pages
        self.holders = holders
        self.faults = faults

    def park(self, holder: Holder) -> None:
        """Stop a turn where it stands (finished, retracted, paused, aborted): keep everything.

        The frontier snapshot stays a TRACK: a park is not a turn end, since a
        retracted or paused turn goes on from here and its next capture moves the
        TRACK on. Only ``end_turn`` makes a snapshot a turn end, so a mid-turn
        frontier never takes the place of a real turn end under the cap.
        """
        holder.status = HolderStatus.PARKED

    def end_turn(self, holder: Holder) -> None:
        """The session recorded a turn end: the frontier snapshot becomes its turn-end
        snapshot, and the slot keeps the MAX_ROLLBACK + 1 newest.

        Those are what a rollback of up to MAX_ROLLBACK recorded turns rewinds to
        (``settle``); the cap counts recorded turn ends only, so neither a
        retraction nor a pause nor an abort mid-turn can push one out.
        """
        if (track := holder.track()) is not None:
            track.kind = PendingKind.TERMINAL
        ends = sorted(b for b, pend in holder.pending.items() if pend.kind is PendingKind.TERMINAL)
        for b in ends[: -(MAX_ROLLBACK + 1)]:
            self.store.free_groups(holder.pending.pop(b).pages, holder.owner, Tier.DEVICE)

    def resume(self, holder: Holder) -> int | None:
        """Reopen a parked slot for ``holder.tokens``; returns where computing resumes.

        ``None`` means the slot had nothing to resume from and is NEW again: the
        caller matches it against the tree like a new request.
        """
        self.settle(holder, len(holder.tokens) - 1)  # the logit reserve
        if holder.status is HolderStatus.NEW:
            return None
        holder.status = HolderStatus.ACTIVE
        self.free_tail(holder, holder.computed_len)
        return holder.computed_len

    def settle(self, holder: Holder, limit: int) -> None:
        """Bring a parked slot's computed tokens back to at most ``limit`` (after a
        rollback, or to leave the logit reserve). Never fails: without a snapshot to
        rewind to, the slot is dropped and becomes NEW."""
        if holder.computed_len <= limit:
            return
        for b in [b for b in holder.pending if b > limit]:
            self.store.free_groups(holder.pending.pop(b).pages, holder.owner, Tier.DEVICE)
        b = max(holder.pending, default=-1)
        if b >= max(holder.cached_len, 1):
            try:
                self.pages.window.cover(holder, b)
            except PoolExhausted:
                pass
            else:
                self.pages.restore(holder, holder.pending[b].pages, b)
                self.free_tail(holder, b)
                return
        self.drop(holder)

    def drop(self, holder: Holder) -> None:
        """Empty a parked slot: every page goes back and the slot is NEW, so its
        session's next turn matches the tree like a new request."""
        self.holders.drop_everything(holder)
        holder.status = HolderStatus.NEW

    def drop_parked(self) -> bool:
        """Empty the parked slot held longest; False if none is parked."""
        for holder in self.holders.records.values():  # opened first, first
            if holder.status is HolderStatus.PARKED:
                self.drop(holder)
                return True
        return False

    def free_tail(self, holder: Holder, prefix_len: int) -> None:
        """Free [prefix_len, allocated_len) page-aligned and set both lengths to prefix_len."""
        if prefix_len >= holder.allocated_len:  # no gap: nothing to free
            return
        full = self.pages.full
        keep = full.pages_for(prefix_len)
        first = (
            prefix_len // full.page_size
            if Fault.SESSION_TAIL_UNALIGNED_FREE in self.faults
            else keep
        )
        if Fault.SESSION_TAIL_LEAK not in self.faults:
            full.free_from(holder, first)
        full.forget_from(holder, keep)
        self.pages.window.free_swa_from(holder, prefix_len)
        holder.computed_len = holder.allocated_len = prefix_len
