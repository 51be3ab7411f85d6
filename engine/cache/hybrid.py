"""HybridPrefixCache: the request-facing contract of the cache.

A request moves through these calls (the engine makes them at step boundaries)::

    open ─► match ─┬─► allocate ─► [runner computes] ─► advance ─► commit_chunk ─┐
                   │        ▲                                                    │
                   │        └────────────────────────────────────────────────────┘
                   ├─► trim          (speculative slots that were not accepted)
                   ├─► retract ─► recover ─► (back to allocate)
                   └─► release(commit=True | False)

``match`` locks the deepest cached node whose continuation snapshot is
complete (state recovery) and restores that state into the holder's own
working pages. Holders never write to tree pages: history pages are borrowed
read-only, and snapshots are copied in and out (working.py).

With ``mode=slots`` the tree stays empty: ``match`` looks the prompt up in
the slot table instead, ``capture_points`` asks for the turn boundary, and
``release`` confirms or aborts the staged snapshot (see slotcache.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from kvwatch.engine.cache import sessions, slotcache
from kvwatch.engine.cache.commit import (
    commit_chunk,
    insert,
    release_for_sharers,
    set_promises,
)
from kvwatch.engine.cache.holder import Holder, HolderStatus, Pending, PendingKind
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.pool import PoolExhausted
from kvwatch.engine.cache.pressure import CachePressure
from kvwatch.engine.cache.radix import Walk
from kvwatch.engine.cache.slots import SlotTable
from kvwatch.engine.cache.working import WorkingState
from kvwatch.engine.config import (
    FULL_KV,
    LINEAR_STATE,
    STATE_GROUPS,
    SWA_KV,
    PrefixCacheMode,
)
from kvwatch.engine.events import SnapshotSkipped
from kvwatch.engine.faults import Fault


class Match(NamedTuple):
    hit_len: int  # tokens found in the tree's history
    resume_len: int  # tokens the holder skips: depth of its restored snapshot


class Capture(NamedTuple):
    """A continuation snapshot the runner computed inside an advanced range."""

    boundary: int
    kind: PendingKind
    linear_state: torch.Tensor  # the L layers' state after token ``boundary - 1``


class HybridPrefixCache(WorkingState, CachePressure):
    def __init__(self, *args, fingerprint: str = "", **kwargs) -> None:
        """``fingerprint`` names the model and geometry; slot keys hash it in."""
        super().__init__(*args, **kwargs)
        self.holders: dict[int, Holder] = {}
        self._holder_ids = itertools.count(1)
        self.slots: SlotTable | None = None
        # depths where queued requests wait to branch off, by holder id (this step's)
        self.promises: dict[int, frozenset[int]] = {}
        self.kept_for_waiters: set[Node] = set()  # snapshots release skipped for a promise
        if self.config.mode is PrefixCacheMode.SLOTS:
            fingerprint = fingerprint or repr(self.config)
            self.slots = SlotTable(self.config.slots, fingerprint, self.faults)

    @property
    def radix(self) -> bool:
        return self.config.mode is PrefixCacheMode.RADIX

    def open(
        self,
        tokens: list[int],
        *,
        extra_key: str | None = None,
        kind: OwnerKind = OwnerKind.REQUEST,
        snapshot_at: int | None = None,
        label: str = "",
    ) -> Holder:
        """A holder over ``tokens``: the caller's own list, read by the cache.

        The caller may append to it (sampled tokens, a new turn) but never
        change what the holder has computed. ``snapshot_at`` is the prompt's
        last turn boundary, where the ``slots`` backend cuts its snapshot.
        """
        hid = next(self._holder_ids)
        holder = Holder(
            hid, Owner(kind, hid), tokens, extra_key, label=label, snapshot_at=snapshot_at
        )
        self.holders[hid] = holder
        return holder

    # -- match and state recovery ---------------------------------------------------
    def match(self, holder: Holder) -> Match:
        """Lock the deepest usable cached prefix of ``holder.tokens`` and restore it.

        At least one token is left to compute, so the last prompt token always
        produces logits. Raises ``PoolExhausted`` (holding nothing new) when
        the working pages cannot be allocated.
        """
        if holder.status not in (HolderStatus.NEW, HolderStatus.RETRACTED):
            raise ValueError(
                f"holder {holder.id} is {holder.status}; only new or retracted holders match"
            )
        if self.slots is not None:
            restored = slotcache.start(self, holder)
            return Match(restored, restored)
        walk = Walk([], 0)
        anchor = None
        if self.radix:
            walk = self.tree.walk(holder.tokens, holder.extra_key, len(holder.tokens) - 1)
            anchor = self._lock_on_descent(walk)
        try:
            self._activate(holder, anchor)
        except PoolExhausted:
            if anchor is not None:
                self.tree.unlock(anchor)
            raise
        if holder.anchor is not None:  # recovered: the host ref has served its purpose
            self.tree.drop_host_ref(holder.anchor)
            holder.anchor = None
        # The tree has history to walk.hit_len but no state there: the holder
        # recomputes through that depth, so it captures the state others need.
        holder.branch_at = walk.hit_len if walk.hit_len > holder.cached_len else 0
        return Match(walk.hit_len, holder.cached_len)

    recover = match

    def promise(self, points: dict[int, frozenset[int]], wanted: set[Node]) -> None:
        """This step's promises, holder id -> depths where queued requests
        wait to branch off that holder's path, and the kept snapshots queued
        requests still want (see ``commit.set_promises``)."""
        set_promises(self, points, wanted)

    def promised_by(self, holder: Holder) -> frozenset[int]:
        """Depths where queued requests wait to branch off ``holder``'s path."""
        return self.promises.get(holder.id, frozenset())

    def _lock_on_descent(self, walk: Walk) -> Node | None:
        """Take refs top-down along the walk, then trim back to a usable snapshot.

        The descent refs the root first. State recovery trims every node below
        the deepest complete snapshot; when nothing is left (a miss, or a
        trim-to-empty) the root ref must go too, or it drifts up by one per
        miss (seed 002).
        """
        tree = self.tree
        tree.inc(tree.root)
        for node in walk.nodes:
            tree.inc(node)
        keep = len(walk.nodes)
        while keep and not self._usable(walk.nodes[keep - 1]):
            keep -= 1
        for node in reversed(walk.nodes[keep:]):
            tree.dec(node)
        if keep == 0:
            if Fault.ROOT_REF_LEAK_ON_MISS not in self.faults:
                tree.dec(tree.root)
            return None
        anchor = walk.nodes[keep - 1]
        tree.touch(anchor)
        return anchor

    def _usable(self, node: Node) -> bool:
        if not node.has_complete_snapshot:
            return False
        return node.snapshot.tier is Tier.DEVICE or self.load(node)

    def _activate(self, holder: Holder, anchor: Node | None) -> None:
        """Give a holder its working pages and restore ``anchor``'s state into them."""
        d = anchor.depth if anchor is not None else 0
        first = max(0, d - self.config.window)
        swa_idx = self.swa_page_range(first, d)
        got = self.alloc_groups({LINEAR_STATE: 1, SWA_KV: len(swa_idx)}, holder.owner)
        holder.working = {LINEAR_STATE: got[LINEAR_STATE]}
        holder.swa_pages = dict(zip(swa_idx, got[SWA_KV].tolist(), strict=True))
        holder.full_pages = (
            np.concatenate([n.pages for n in reversed(list(anchor.path()))]).tolist()
            if anchor
            else []
        )
        holder.lock_node = anchor
        holder.cached_len = holder.computed_len = holder.allocated_len = d
        holder.status = HolderStatus.ACTIVE
        self.restore_state(holder, anchor.snapshot.pages if anchor else None, d)

    # -- compute bookkeeping ----------------------------------------------------------
    def allocate(self, holder: Holder, n: int) -> None:
        """Pages for tokens [allocated_len, allocated_len + n) in full.kv and swa.kv."""
        self._require(holder, HolderStatus.ACTIVE)
        start, end = holder.allocated_len, holder.allocated_len + n
        need_full = math.ceil(end / self.page_size) - len(holder.full_pages)
        swa_idx = [j for j in self.swa_page_range(start, end) if j not in holder.swa_pages]
        got = self.alloc_groups({FULL_KV: need_full, SWA_KV: len(swa_idx)}, holder.owner)
        holder.full_pages.extend(got[FULL_KV].tolist())
        holder.swa_pages.update(zip(swa_idx, got[SWA_KV].tolist(), strict=True))
        holder.allocated_len = end

    def capture_points(self, holder: Holder, start: int, end: int) -> list[tuple[int, PendingKind]]:
        """Boundaries in (start, end] where the runner must capture state.

        Every multiple of ``snapshot_interval``, the holder's ``branch_at``
        (the depth where its prompt left the tree with no state to resume
        from; a branch point, so kept for siblings) and promised points
        (where queued requests wait to branch off), plus the last page boundary
        (the TRACK that follows the frontier and ends a turn). A session
        commits nothing until it closes, so it only keeps the TRACK. The
        ``slots`` backend wants one point: its prepared turn boundary.
        """
        if self.slots is not None:
            return slotcache.capture_points(holder, start, end)
        if not self.radix:
            return []
        p = self.page_size
        session = holder.owner.kind is OwnerKind.SESSION
        interval = self.config.snapshot_interval
        intervals = (
            [] if session else range(-(-(start + 1) // interval) * interval, end + 1, interval)
        )
        points = dict.fromkeys(intervals, PendingKind.INTERVAL)
        if not session:
            for b in (holder.branch_at, *self.promised_by(holder)):
                if start < b <= end:
                    points.setdefault(b, PendingKind.BRANCH)
        last = end - end % p
        if last > start:
            points.setdefault(last, PendingKind.TRACK)
        return list(points.items())

    def advance(self, holder: Holder, new_len: int, captures: Sequence[Capture] = ()) -> None:
        """Mark tokens up to ``new_len`` computed and take the captured snapshots.

        Then drop ``swa.kv`` pages that fell behind the window: a page goes
        once all its positions are < new_len - W.
        """
        self._require(holder, HolderStatus.ACTIVE)
        if not holder.computed_len <= new_len <= holder.allocated_len:
            raise ValueError(
                f"advance to {new_len} outside computed {holder.computed_len} .. allocated {holder.allocated_len}"
            )
        for cap in captures:
            if not holder.computed_len < cap.boundary <= new_len:
                raise ValueError(f"capture at {cap.boundary} outside the advanced range")
            self._capture(holder, cap)
        holder.computed_len = new_len
        cutoff = new_len - self.config.window
        ps = self.pools[SWA_KV].page_size
        dead = [j for j in holder.swa_pages if (j + 1) * ps <= cutoff]
        if dead:
            self.pools[SWA_KV].free([holder.swa_pages.pop(j) for j in dead], holder.owner)

    def _capture(self, holder: Holder, cap: Capture) -> None:
        if cap.kind is PendingKind.SLOT:
            slotcache.capture(self, holder, cap.boundary, cap.linear_state)
            return
        track = holder.track()
        if track is not None:  # the older frontier snapshot is obsolete: reuse its pages
            del holder.pending[track.boundary]
            pages = track.pages
        else:
            counts = {g: self.config.pages_per_snapshot(g) for g in STATE_GROUPS}
            try:
                pages = self.alloc_groups(counts, holder.owner)
            except PoolExhausted as exc:  # snapshots are an optimisation: go on without
                self.events.emit(SnapshotSkipped(holder.id, cap.boundary, str(exc)))
                return
        self.write_snapshot(holder, pages, cap.boundary, cap.linear_state)
        holder.pending[cap.boundary] = Pending(cap.boundary, pages, cap.kind)

    def trim(self, holder: Holder, keep_len: int) -> None:
        """Free slots allocated beyond ``keep_len``; a partly kept page stays."""
        self._require(holder, HolderStatus.ACTIVE)
        if not holder.computed_len <= keep_len <= holder.allocated_len:
            raise ValueError(f"trim to {keep_len} outside computed .. allocated")
        keep_pages = math.ceil(keep_len / self.page_size)
        self.pools[FULL_KV].free(holder.full_pages[keep_pages:], holder.owner)
        del holder.full_pages[keep_pages:]
        ps = self.pools[SWA_KV].page_size
        extra = [j for j in holder.swa_pages if j * ps >= keep_len]
        self.pools[SWA_KV].free([holder.swa_pages.pop(j) for j in extra], holder.owner)
        holder.allocated_len = keep_len

    def commit_chunk(self, holder: Holder, terminal: bool = False) -> int:
        return commit_chunk(self, holder, terminal)

    # -- sessions (see sessions.py) ------------------------------------------------------
    def park(self, holder: Holder) -> None:
        self._require(holder, HolderStatus.ACTIVE)
        sessions.park(self, holder)

    def resume(self, holder: Holder) -> int | None:
        self._require(holder, HolderStatus.PARKED)
        return sessions.resume(self, holder)

    def drop_parked(self) -> bool:
        """Under pressure, empty the parked slot held longest; False if none is parked.

        A session's slot keeps its pages between turns and while its turn is
        retracted, so parked slots alone can fill a pool that a new request
        would fit in; a dropped slot costs its session a recompute, not a turn.
        """
        for holder in self.holders.values():  # opened first, first
            if holder.status is HolderStatus.PARKED:
                sessions.drop(self, holder)
                return True
        return False

    def settle(self, holder: Holder, limit: int) -> None:
        if holder.status is HolderStatus.PARKED:
            sessions.settle(self, holder, limit)

    # -- leaving --------------------------------------------------------------------
    def retract(self, holder: Holder) -> None:
        """Free a running holder's pages under pressure; it recovers later via ``match``.

        It commits first (its frontier snapshot included), then keeps a host
        ref on its deepest complete snapshot. That snapshot moves to the host
        tier when no running holder still uses it.
        """
        self._require(holder, HolderStatus.ACTIVE)
        self.commit_chunk(holder, terminal=True)
        slotcache.abort(self, holder, "retracted")
        anchor = (
            next((n for n in holder.lock_node.path() if n.has_complete_snapshot), None)
            if holder.lock_node
            else None
        )
        if anchor is not None:
            self.tree.add_host_ref(anchor)
        self.drop_everything(holder)
        holder.anchor = anchor
        holder.status = HolderStatus.RETRACTED
        if anchor is not None and anchor.refs == 0 and anchor.snapshot.tier is Tier.DEVICE:
            self.offload(anchor)

    def release(self, holder: Holder, *, commit: bool) -> None:
        """Finish (``commit=True``) or abort/pause (``commit=False``) a holder for good.

        The abort path inserts nothing, so every snapshot the holder captured
        and still holds must be freed here (seed 002's big-page buffers).
        """
        if holder.status in (HolderStatus.ACTIVE, HolderStatus.PARKED):
            holder.status = HolderStatus.ACTIVE
            if commit:  # a finished request, or a closing session
                insert(self, holder, terminal=True)
                slotcache.confirm(self, holder)
            else:
                slotcache.abort(self, holder, "aborted")
            leak = not commit and Fault.ABORT_STATE_BUFFER_LEAK in self.faults
            self.drop_everything(holder, free_pending=not leak)
        elif holder.status is HolderStatus.RETRACTED and holder.anchor is not None:
            self.tree.drop_host_ref(holder.anchor)
            holder.anchor = None
        holder.status = HolderStatus.RELEASED
        self.holders.pop(holder.id, None)

    def drop_everything(self, holder: Holder, *, free_pending: bool = True) -> None:
        """Unlock the path and free every page the holder owns.

        A snapshot this holder shared with another becomes that one's alone
        here; if it is superseded on that holder's path it goes now rather
        than at that holder's next commit.
        """
        path = list(holder.lock_node.path()) if holder.lock_node is not None else []
        if holder.lock_node is not None:
            self.tree.unlock(holder.lock_node)
        self.pools[FULL_KV].free(holder.own_full_pages(self.page_size), holder.owner)
        self.pools[SWA_KV].free(list(holder.swa_pages.values()), holder.owner)
        self.free_groups(holder.working, holder.owner, Tier.DEVICE)
        for pend in holder.pending.values() if free_pending else ():
            self.free_groups(pend.pages, holder.owner, Tier.DEVICE)
        holder.lock_node = None
        holder.full_pages, holder.swa_pages, holder.working, holder.pending = [], {}, {}, {}
        holder.cached_len = holder.computed_len = holder.allocated_len = 0
        if path and Fault.INTERIOR_SNAPSHOT_LEAK not in self.faults:
            release_for_sharers(self, path)

    # -- helpers --------------------------------------------------------------------
    def _require(self, holder: Holder, status: HolderStatus) -> None:
        if holder.status is not status:
            raise ValueError(f"holder {holder.id} is {holder.status}, expected {status}")
