"""CacheBase: the cache's façade, over the parts every backend shares.

The façade is what the engine calls (``ServedCache``, protocol.py) and
nothing more; the parts behind it each do one job::

    CacheBase ──► HolderPages ──► FullAttentionPages / SlidingWindowPages / LinearStatePages
        │               (a holder's pages, per group family)           │
        ├──► HolderTable       (the records behind the handles)         ▼
        ├──► SessionSlots      (parked session slots)             CacheStorage ──► pools, tree
        └──► view / reads       (read-only: the audit, usage, the probe)

Here: opening holders (``HolderTable``), their own pages (allocate, advance
with captures, trim), the session calls (``SessionSlots``), leaving (retract,
release) and the failpoint schedule. A backend adds where shared state comes
from and goes to: ``match``, ``capture_points``, ``commit_chunk``, and the
hooks ``_finish``, ``_abort``, ``_retract_anchor`` and ``_left_path``, and what
it keeps beyond the tree (``_stored``, ``_branches``). Every public call that
mutates runs inside ``events.deferred()`` (``mutation``): listeners see a
mutation's events once it is complete.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import torch

from kvwatch.engine.cache.branches import NoBranches
from kvwatch.engine.cache.deferred import mutation
from kvwatch.engine.cache.failpoints import Failpoints, Site
from kvwatch.engine.cache.holder import Handle, Holder, HolderStatus, Pending, PendingKind
from kvwatch.engine.cache.holder_pages import HolderPages
from kvwatch.engine.cache.holder_table import HolderTable
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import OwnerKind
from kvwatch.engine.cache.pool import PageLayout, PagePool, PoolExhausted
from kvwatch.engine.cache.protocol import (
    AuditableCache,
    BranchPromises,
    Capture,
    PageTable,
    ServedCache,
    holder_of,
)
from kvwatch.engine.cache.reads import CacheReads
from kvwatch.engine.cache.sessions import SessionSlots
from kvwatch.engine.cache.storage import CacheStorage
from kvwatch.engine.cache.view import CacheView, StoredReads
from kvwatch.engine.config import CacheConfig
from kvwatch.engine.events import EventBus, SnapshotSkipped
from kvwatch.engine.faults import Fault

# what a capture's snapshot is for: every other kind is the frontier's (TRACK)
SNAPSHOT_SITES = {
    PendingKind.INTERVAL: Site.SNAPSHOT_INTERVAL,
    PendingKind.BRANCH: Site.SNAPSHOT_BRANCH,
}


def _allocate_site(holder: Holder, n: int) -> Site:
    """What ``allocate`` asks pages for: a prefill chunk while more than the
    last token is uncomputed, else a decode token, or a verify step's drafts."""
    if len(holder.tokens) - holder.computed_len > 1:
        return Site.ALLOCATE_PREFILL
    return Site.ALLOCATE_DRAFTS if n > 1 else Site.ALLOCATE_DECODE


class CacheBase(ServedCache):
    # Whether holders keep a working state: a linear state page and the last W
    # positions of swa.kv (a backend for a full-attention model keeps neither).
    _keeps_state = True

    def __init__(
        self,
        config: CacheConfig,
        layouts: Mapping[str, PageLayout] | None = None,
        *,
        faults: frozenset[Fault] = frozenset(),
        device: str | torch.device = "cpu",
        events: EventBus | None = None,
        fingerprint: str = "",
    ) -> None:
        """``fingerprint`` names the model and geometry (the slot backend keys on it)."""
        self._config, self._faults = config, faults
        self._fingerprint = fingerprint or repr(config)
        self._events = events or EventBus()
        self._store = CacheStorage(
            config, layouts, faults=faults, device=device, events=self._events
        )
        self._pages = HolderPages(self._store, config, keeps_state=self._keeps_state)
        self.page_size = config.page_size
        self._holders = HolderTable(self._store, self._pages, self._left_path)
        self._sessions = SessionSlots(self._store, self._pages, self._holders, faults)
        self._stored = StoredReads()  # what the backend keeps beyond the tree: nothing
        self._branches: BranchPromises = NoBranches()

    @property
    def pools(self) -> Mapping[str, PagePool]:
        return self._store.pools

    def open(
        self,
        tokens: list[int],
        *,
        extra_key: str | None = None,
        kind: OwnerKind = OwnerKind.REQUEST,
        snapshot_at: int | None = None,
        label: str = "",
    ) -> Handle:
        """A holder over ``tokens``: the caller's own list, read by the cache.

        The caller may append to it (sampled tokens, a new turn) but never
        change what the holder has computed. ``snapshot_at`` is the prompt's
        last turn boundary, where the ``slots`` backend cuts its snapshot.
        """
        return self._holders.open(
            tokens, extra_key=extra_key, kind=kind, snapshot_at=snapshot_at, label=label
        )

    # -- a holder's own pages -----------------------------------------------------------
    @mutation
    def allocate(self, h: Handle, n: int) -> None:
        """Pages for tokens [allocated_len, allocated_len + n) in full.kv and swa.kv."""
        holder = self._active(h)
        self._pages.allocate(holder, n, site=_allocate_site(holder, n))

    @mutation
    def set_working_state(self, h: Handle, state: torch.Tensor) -> None:
        """Overwrite the holder's working linear state (one page entry)."""
        self._pages.linear.set(holder_of(h), state)

    @mutation
    def advance(self, h: Handle, new_len: int, captures: Sequence[Capture] = ()) -> None:
        """Mark tokens up to ``new_len`` computed and take the captured snapshots.

        Then drop ``swa.kv`` pages that fell behind the window: a page goes
        once all its positions are < new_len - W.
        """
        holder = self._active(h)
        if not holder.computed_len <= new_len <= holder.allocated_len:
            raise ValueError(
                f"advance to {new_len} outside computed {holder.computed_len} .. "
                f"allocated {holder.allocated_len}"
            )
        for cap in captures:
            if not holder.computed_len < cap.boundary <= new_len:
                raise ValueError(f"capture at {cap.boundary} outside the advanced range")
            self._capture(holder, cap)
        holder.computed_len = new_len
        self._pages.window.free_swa_behind(holder, new_len - self._config.window)

    def _capture(self, holder: Holder, cap: Capture) -> None:
        """Keep the state at ``cap.boundary`` in snapshot pages the holder owns."""
        track = holder.track()
        if track is not None:  # the older frontier snapshot is obsolete: reuse its pages
            del holder.pending[track.boundary]
            pages = track.pages
        else:
            counts = self._pages.snapshot_counts()
            site = SNAPSHOT_SITES.get(cap.kind, Site.SNAPSHOT_TRACK)
            try:
                pages = self._store.alloc_groups(counts, holder.owner, site=site)
            except PoolExhausted as exc:  # snapshots are an optimisation: go on without
                self._events.emit(SnapshotSkipped(holder.id, cap.boundary, str(exc)))
                return
        self._pages.write_snapshot(holder, pages, cap.boundary, cap.linear_state)
        holder.pending[cap.boundary] = Pending(cap.boundary, pages, cap.kind)

    @mutation
    def trim(self, h: Handle, keep_len: int) -> None:
        """Free slots allocated beyond ``keep_len``; a partly kept page stays."""
        holder = self._active(h)
        if not holder.computed_len <= keep_len <= holder.allocated_len:
            raise ValueError(f"trim to {keep_len} outside computed .. allocated")
        self._pages.trim(holder, keep_len)
        holder.allocated_len = keep_len

    def page_table(self, h: Handle) -> PageTable:
        return self._pages.page_table(holder_of(h))

    def read_aux(self, h: Handle, name: str) -> torch.Tensor:
        return self._pages.full.read_aux(holder_of(h), name)

    # -- sessions (sessions.py) -----------------------------------------------------------
    @mutation
    def park(self, h: Handle) -> None:
        self._sessions.park(self._active(h))

    @mutation
    def end_turn(self, h: Handle) -> None:
        """The session recorded a turn end: its parked slot's frontier becomes a
        turn-end snapshot (what a rollback returns to). Only a parked slot has one."""
        holder = holder_of(h)
        if holder.status is HolderStatus.PARKED:
            self._sessions.end_turn(holder)

    @mutation
    def resume(self, h: Handle) -> int | None:
        return self._sessions.resume(self._require(h, HolderStatus.PARKED))

    @mutation
    def settle(self, h: Handle, limit: int) -> None:
        holder = holder_of(h)
        if holder.status is HolderStatus.PARKED:
            self._sessions.settle(holder, limit)

    @mutation
    def drop_parked(self) -> bool:
        """Under pressure, empty the parked slot held longest; False if none is parked.

        A session's slot keeps its pages between turns and while its turn is
        retracted, so parked slots alone can fill a pool that a new request
        would fit in; a dropped slot costs its session a recompute, not a turn.
        """
        return self._sessions.drop_parked()

    # -- leaving --------------------------------------------------------------------------
    @mutation
    def retract(self, h: Handle) -> None:
        """Free a running holder's pages under pressure; it recovers later via ``match``.

        The backend first shares what it can and names the recovery node to
        keep a host ref on (``_retract_anchor``).
        """
        holder = self._active(h)
        anchor = self._retract_anchor(holder)
        self._holders.drop_everything(holder)
        holder.anchor = anchor
        holder.status = HolderStatus.RETRACTED
        if anchor is not None and anchor.refs == 0 and anchor.snapshot.tier is Tier.DEVICE:
            self._store.offload(anchor)

    @mutation
    def release(self, h: Handle, *, commit: bool) -> None:
        """Finish (``commit=True``) or abort/pause (``commit=False``) a holder for good.

        The abort path shares nothing, so every snapshot the holder captured
        and still holds must be freed here (seed 002's big-page buffers).
        """
        holder = holder_of(h)
        parked = not commit and Fault.ABORTED_HOLDER_PARKED in self._faults
        if parked and holder.status is HolderStatus.ACTIVE:  # kept as if a session resumed it
            self._sessions.park(holder)
            return
        if holder.status in (HolderStatus.ACTIVE, HolderStatus.PARKED):
            holder.status = HolderStatus.ACTIVE
            if commit:  # a finished request, or a closing session
                self._finish(holder)
            else:
                self._abort(holder, "aborted")
            leak = not commit and Fault.ABORT_STATE_BUFFER_LEAK in self._faults
            self._holders.drop_everything(holder, free_pending=not leak)
        elif holder.status is HolderStatus.RETRACTED and holder.anchor is not None:
            # the anchor may sit inside a running holder's path, kept only for
            # this recovery: that holder's superseded snapshot goes now
            anchor, holder.anchor = holder.anchor, None
            self._store.tree.drop_host_ref(anchor)
            self._left_path(list(anchor.path()))
        holder.status = HolderStatus.RELEASED
        self._holders.records.pop(holder.id, None)

    # -- backend hooks (defaults: nothing is shared) ----------------------------------------
    def commit_chunk(self, h: Handle, terminal: bool = False) -> int:
        return 0

    def _finish(self, holder: Holder) -> None:
        """A holder finishes: share what it computed."""

    def _abort(self, holder: Holder, reason: str) -> None:
        """A holder leaves without sharing (aborted, paused, retracted)."""

    def _retract_anchor(self, holder: Holder) -> Node | None:
        """Before a retraction: share, and name the node to recover from."""
        return None

    def _left_path(self, path: list[Node]) -> None:
        """A holder unlocked ``path``."""

    @mutation
    def flush(self) -> None:
        self._store.flush()

    # -- helpers --------------------------------------------------------------------------
    def _require(self, h: Handle, status: HolderStatus) -> Holder:
        holder = holder_of(h)
        if holder.status is not status:
            raise ValueError(f"holder {holder.id} is {holder.status}, expected {status}")
        return holder

    def _matchable(self, h: Handle) -> Holder:
        holder = holder_of(h)
        if holder.status not in (HolderStatus.NEW, HolderStatus.RETRACTED):
            raise ValueError(
                f"holder {holder.id} is {holder.status}; only new or retracted holders match"
            )
        return holder

    def _active(self, h: Handle) -> Holder:
        return self._require(h, HolderStatus.ACTIVE)

    # -- capabilities beside the lifecycle ----------------------------------------------------
    @property
    def failpoints(self) -> Failpoints:
        """The failpoint schedule (a testing aid): ``arm`` it, ``fail_next`` a site."""
        return self._store.failpoints

    @property
    def branches(self) -> BranchPromises:
        return self._branches

    @property
    def view(self) -> CacheView:
        """The cache read-only, as it is now: what the audit and usage figures read."""
        return CacheView(
            config=self._config,
            tree=self._store.tree,
            pools=MappingProxyType(self._store.pools),
            host_pools=MappingProxyType(self._store.host_pools),
            holders=MappingProxyType(self._holders.records),
            stored=self._stored,
        )

    @property
    def reads(self) -> AuditableCache:
        return CacheReads(self.view)
