"""CacheBase: what every backend does the same way, and its collaborators.

A backend owns:

* ``store`` (``CacheStorage``): the pools, the tree and the pressure order;
* ``working`` (``WorkingState``): copies between holders and snapshot pages;
* ``holders``: the records behind the handles it gave out.

Here: holders' own pages (allocate, advance, trim, leave), session slots
(park, end_turn, resume, settle; see sessions.py) and the pure reads. A backend adds
where shared state comes from and goes to: ``match``, ``capture_points``,
``commit_chunk`` and the hooks ``_finish``, ``_abort``, ``_retract_anchor``
and ``_left_path``. Every public call that mutates runs inside
``events.deferred()``: listeners see a mutation's events once it is complete.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

import torch

from kvwatch.engine.cache import reads, sessions
from kvwatch.engine.cache.failpoints import Site, parse_sites
from kvwatch.engine.cache.holder import Holder, HolderStatus, Pending, PendingKind
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.pool import PageLayout, PagePool, PoolExhausted
from kvwatch.engine.cache.protocol import (
    Capture,
    Handle,
    PageTable,
    ProbeReads,
    ServedCache,
    holder_of,
)
from kvwatch.engine.cache.storage import CacheStorage
from kvwatch.engine.cache.usage import GroupUsage, group_usage
from kvwatch.engine.cache.working import WorkingState
from kvwatch.engine.config import FULL_KV, LINEAR_STATE, STATE_GROUPS, SWA_KV, CacheConfig
from kvwatch.engine.events import EventBus, SnapshotSkipped
from kvwatch.engine.faults import Fault

if TYPE_CHECKING:
    from kvwatch.contracts import Finding, RootRefs, SlotReport, TreeReport
    from kvwatch.engine.cache.claims import Claims
    from kvwatch.engine.cache.radix import RadixTree
    from kvwatch.engine.cache.slots import Slot

F = TypeVar("F", bound=Callable)
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


def mutation(fn: F) -> F:
    """Deliver the events ``fn`` emits once it returns (or raises): never mid-change."""

    @functools.wraps(fn)
    def wrapper(self: CacheBase, *args, **kwargs):
        with self.events.deferred():
            return fn(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class CacheBase(ServedCache):
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
        self.config, self.faults = config, faults
        self.fingerprint = fingerprint or repr(config)
        self.events = events or EventBus()
        self.store = CacheStorage(config, layouts, faults=faults, device=device, events=self.events)
        self.working = WorkingState(self.store.pools, config.window)
        self.page_size = config.page_size
        self.holders: dict[int, Holder] = {}
        self._holder_ids = itertools.count(1)

    @property
    def pools(self) -> Mapping[str, PagePool]:
        return self.store.pools

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
        hid = next(self._holder_ids)
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
        self.holders[hid] = holder
        return holder.handle

    # -- a holder's own pages -----------------------------------------------------------
    # Whether holders keep a working state: a linear state page and the last W
    # positions of swa.kv (a backend for a full-attention model keeps neither).
    keeps_state = True

    def _swa_page_range(self, start: int, end: int) -> range:
        """The swa.kv page indices a holder needs for positions [start, end)."""
        return self.working.swa_page_range(start, end) if self.keeps_state else range(0)

    def _give_working_pages(
        self, holder: Holder, d: int, full_pages: int = 0, *, site: Site = Site.ADMIT_WORKING
    ) -> None:
        """A working state, the window below ``d`` and ``full_pages`` own full.kv pages."""
        swa_idx = self._swa_page_range(max(0, d - self.config.window), d)
        counts = {LINEAR_STATE: int(self.keeps_state), SWA_KV: len(swa_idx), FULL_KV: full_pages}
        got = self.store.alloc_groups(counts, holder.owner, site=site)
        holder.working = {LINEAR_STATE: got[LINEAR_STATE]} if self.keeps_state else {}
        holder.swa_pages = dict(zip(swa_idx, got[SWA_KV].tolist(), strict=True))
        holder.full_pages = got[FULL_KV].tolist()

    @mutation
    def allocate(self, h: Handle, n: int) -> None:
        """Pages for tokens [allocated_len, allocated_len + n) in full.kv and swa.kv."""
        holder = self._active(h)
        start, end = holder.allocated_len, holder.allocated_len + n
        need_full = math.ceil(end / self.page_size) - len(holder.full_pages)
        swa_idx = [j for j in self._swa_page_range(start, end) if j not in holder.swa_pages]
        counts = {FULL_KV: need_full, SWA_KV: len(swa_idx)}
        got = self.store.alloc_groups(counts, holder.owner, site=_allocate_site(holder, n))
        holder.full_pages.extend(got[FULL_KV].tolist())
        holder.swa_pages.update(zip(swa_idx, got[SWA_KV].tolist(), strict=True))
        holder.allocated_len = end

    @mutation
    def set_working_state(self, h: Handle, state: torch.Tensor) -> None:
        """Overwrite the holder's working linear state (one page entry)."""
        holder = holder_of(h)
        self.store.pools[LINEAR_STATE].set_page_data(holder.working[LINEAR_STATE], state)

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
        self.store.free_swa_behind(holder, new_len - self.config.window)

    def _capture(self, holder: Holder, cap: Capture) -> None:
        """Keep the state at ``cap.boundary`` in snapshot pages the holder owns."""
        track = holder.track()
        if track is not None:  # the older frontier snapshot is obsolete: reuse its pages
            del holder.pending[track.boundary]
            pages = track.pages
        else:
            counts = {g: self.config.pages_per_snapshot(g) for g in STATE_GROUPS}
            site = SNAPSHOT_SITES.get(cap.kind, Site.SNAPSHOT_TRACK)
            try:
                pages = self.store.alloc_groups(counts, holder.owner, site=site)
            except PoolExhausted as exc:  # snapshots are an optimisation: go on without
                self.events.emit(SnapshotSkipped(holder.id, cap.boundary, str(exc)))
                return
        self.working.write_snapshot(holder, pages, cap.boundary, cap.linear_state)
        holder.pending[cap.boundary] = Pending(cap.boundary, pages, cap.kind)

    @mutation
    def trim(self, h: Handle, keep_len: int) -> None:
        """Free slots allocated beyond ``keep_len``; a partly kept page stays."""
        holder = self._active(h)
        if not holder.computed_len <= keep_len <= holder.allocated_len:
            raise ValueError(f"trim to {keep_len} outside computed .. allocated")
        keep_pages = math.ceil(keep_len / self.page_size)
        self.store.free_pages(FULL_KV, holder.full_pages[keep_pages:], holder.owner)
        del holder.full_pages[keep_pages:]
        self.store.free_swa_from(holder, keep_len)
        holder.allocated_len = keep_len

    # -- sessions (see sessions.py) -------------------------------------------------------
    @mutation
    def park(self, h: Handle) -> None:
        sessions.park(self, self._active(h))

    @mutation
    def end_turn(self, h: Handle) -> None:
        """The session recorded a turn end: its parked slot's frontier becomes a
        turn-end snapshot (what a rollback returns to). Only a parked slot has one."""
        holder = holder_of(h)
        if holder.status is HolderStatus.PARKED:
            sessions.end_turn(self, holder)

    @mutation
    def resume(self, h: Handle) -> int | None:
        return sessions.resume(self, self._require(h, HolderStatus.PARKED))

    @mutation
    def settle(self, h: Handle, limit: int) -> None:
        holder = holder_of(h)
        if holder.status is HolderStatus.PARKED:
            sessions.settle(self, holder, limit)

    @mutation
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

    # -- leaving --------------------------------------------------------------------------
    @mutation
    def retract(self, h: Handle) -> None:
        """Free a running holder's pages under pressure; it recovers later via ``match``.

        The backend first shares what it can and names the recovery node to
        keep a host ref on (``_retract_anchor``).
        """
        holder = self._active(h)
        anchor = self._retract_anchor(holder)
        self.drop_everything(holder)
        holder.anchor = anchor
        holder.status = HolderStatus.RETRACTED
        if anchor is not None and anchor.refs == 0 and anchor.snapshot.tier is Tier.DEVICE:
            self.store.offload(anchor)

    @mutation
    def release(self, h: Handle, *, commit: bool) -> None:
        """Finish (``commit=True``) or abort/pause (``commit=False``) a holder for good.

        The abort path shares nothing, so every snapshot the holder captured
        and still holds must be freed here (seed 002's big-page buffers).
        """
        holder = holder_of(h)
        if holder.status in (HolderStatus.ACTIVE, HolderStatus.PARKED):
            holder.status = HolderStatus.ACTIVE
            if commit:  # a finished request, or a closing session
                self._finish(holder)
            else:
                self._abort(holder, "aborted")
            leak = not commit and Fault.ABORT_STATE_BUFFER_LEAK in self.faults
            self.drop_everything(holder, free_pending=not leak)
        elif holder.status is HolderStatus.RETRACTED and holder.anchor is not None:
            # the anchor may sit inside a running holder's path, kept only for
            # this recovery: that holder's superseded snapshot goes now
            anchor, holder.anchor = holder.anchor, None
            self.store.tree.drop_host_ref(anchor)
            self._left_path(list(anchor.path()))
        holder.status = HolderStatus.RELEASED
        self.holders.pop(holder.id, None)

    def arm_failpoints(self, armed: bool) -> None:
        """Failpoints on or off between steps (a testing aid; nothing if none are set)."""
        self.store.failpoints.arm(armed)

    def fail_next(self, site: str) -> None:
        """Fail the next hit of failpoint ``site`` (a testing aid, failpoints set or not)."""
        (named,) = parse_sites([site])  # ValueError naming the sites there are
        self.store.failpoints.fail_next(named)

    def drop_everything(self, holder: Holder, *, free_pending: bool = True) -> None:
        """Unlock the path and free every page the holder owns."""
        path = list(holder.lock_node.path()) if holder.lock_node is not None else []
        if holder.lock_node is not None:
            self.store.tree.unlock(holder.lock_node)
        self.store.free_pages(FULL_KV, holder.own_full_pages(self.page_size), holder.owner)
        self.store.free_pages(SWA_KV, list(holder.swa_pages.values()), holder.owner)
        self.store.free_groups(holder.working, holder.owner, Tier.DEVICE)
        for pend in holder.pending.values() if free_pending else ():
            self.store.free_groups(pend.pages, holder.owner, Tier.DEVICE)
        holder.lock_node = None
        holder.full_pages, holder.swa_pages, holder.working, holder.pending = [], {}, {}, {}
        holder.cached_len = holder.computed_len = holder.allocated_len = 0
        if path:
            self._left_path(path)

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
        self.store.flush()

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

    def page_table(self, h: Handle) -> PageTable:
        holder = holder_of(h)
        linear = holder.working.get(LINEAR_STATE)
        return PageTable(
            holder.full_pages, holder.swa_pages, int(linear[0]) if linear is not None else -1
        )

    def read_aux(self, h: Handle, name: str) -> torch.Tensor:
        holder = holder_of(h)
        pool = self.store.pools[FULL_KV]
        return pool.read_aux(name, holder.full_pages, 0, holder.computed_len)

    # -- probe-facing reads (reads.py) ------------------------------------------------------
    def probe(self, slack_tokens: int) -> ProbeReads:
        return reads.probe_reads(self, slack_tokens)

    def usage(self) -> dict[str, GroupUsage]:
        return group_usage(self)

    def structure(self) -> tuple[TreeReport, SlotReport | None, RootRefs]:
        return reads.tree_report(self.store.tree), self.slot_report(), reads.counted_root_refs(self)

    # What the audit, the usage bound and the probe ask a backend about its own
    # storage beyond the tree (defaults: there is none).
    def claim_stored(self, claims: Claims) -> None:
        """Register the backend's own stored pages with the audit's claims."""

    def stored_findings(self) -> list[Finding]:
        """The backend's own consistency findings."""
        return []

    def stored_evictable(self) -> dict[str, int]:
        """Pages of the backend's own storage that pressure or a flush may take back,
        by group (the pool gauges' ``evictable`` counts them beside the tree's)."""
        return {}

    def stored_snapshots(self) -> list[Slot]:
        """Whole-state snapshots the backend keeps outside the tree (for the bound)."""
        return []

    def kept_for_waiters(self) -> frozenset[Node]:
        """Snapshots kept past their release for queued requests (shared, for the bound)."""
        return frozenset()

    def stopped_commits(self) -> list[str]:
        """Running holders whose commit stopped short of what they computed."""
        return []

    def slot_report(self) -> SlotReport | None:
        return None

    @property
    def branch_waits(self) -> bool:
        return False

    def promised_by(self, h: Handle) -> frozenset[int]:
        return frozenset()

    def keeps_for_waiters(self) -> bool:
        return False

    def kept_on_path(self, tokens: list[int], extra_key: str | None, limit: int) -> set[object]:
        return set()

    def promise(self, points: Mapping[int, frozenset[int]], wanted: set[object]) -> None:
        """Nothing to promise where nothing is shared."""

    @property
    def tree(self) -> RadixTree:
        """The store's tree (a white-box read for tests and benchmarks)."""
        return self.store.tree
