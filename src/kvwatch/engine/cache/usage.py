"""Pool usage by owner, and the bound that live holders put on it.

``group_usage`` is what a probe reports per group. ``usage_bounds`` compares
the pages that nothing can take back (not free, not evictable, not prunable)
with what the live holders justify:

* ``full.kv``: each running (or parked session) holder ceil(computed / P)
  pages plus the slack it may allocate ahead, each retracted one the path to
  its recovery node. Shared tree pages are counted once in usage but once per
  holder in the limit, so sharing never trips it.
* ``swa.kv``: each running holder its last W positions plus the slack.
* state groups: each holder O(1) snapshots, independent of how many turns it
  has run: the deepest snapshot on its path and its frontier snapshot (a
  retracted holder: its recovery snapshot), plus the working state; a session
  also keeps MAX_ROLLBACK + 1 turn-end snapshots while a turn runs: the
  previous turn's end, and the MAX_ROLLBACK before it, which a rollback after
  this turn is cut returns to (``SessionSlots.end_turn``). Only
  snapshots that a single holder pins count here; a snapshot several holders
  share is kept on purpose while they do, and so is one at a branch point
  (where siblings resume): both are reported as ``shared``.
* ``slots`` mode: each filled slot its snapshot (ceil(length / P) history
  pages and one snapshot per state group), and each holder its staged copy.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from kvwatch.contracts import Bound
from kvwatch.engine.cache.holder import Holder, HolderStatus, PendingKind
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import OWNER_LABEL, OwnerKind
from kvwatch.engine.cache.view import CacheView
from kvwatch.engine.config import FULL_KV, MAX_ROLLBACK, STATE_GROUPS, SWA_KV

SNAPSHOTS_PER_HOLDER = 2


class GroupUsage(NamedTuple):
    group: str
    family: str
    capacity: int
    free: int
    # tree, request, session, slot; host: every host-tier page, and host_evictable: those
    # of them that cache a snapshot no retracted request will recover from
    by_owner: dict[str, int]
    evictable: int  # tree-held pages that eviction or pruning may take back
    host_capacity: int


def _anchored(view: CacheView) -> set[Node]:
    """Retracted holders' recovery nodes and everything above them: pinned even
    at zero refs, because eviction only takes leaves."""
    out: set[Node] = set()
    for holder in view.holders.values():
        if holder.anchor is not None:
            out.update(holder.anchor.path())
    return out


def group_usage(view: CacheView) -> dict[str, GroupUsage]:
    """Per group: capacity, free pages, pages by owner kind, and the tree-held
    pages eviction or pruning may take back (one walk over the tree)."""
    anchored = _anchored(view)
    evictable = dict.fromkeys(view.pools, 0)
    for group, n in view.stored.evictable().items():  # slot mode: the filled slots
        evictable[group] += n
    host_cached = dict.fromkeys(view.pools, 0)
    for node in view.tree.nodes()[1:]:
        locked = node.refs > 0
        if not locked and node not in anchored:
            evictable[FULL_KV] += len(node.pages)
        snap = node.snapshot
        if snap is not None and snap.tier is Tier.DEVICE and not locked and not node.host_refs:
            for group, pages in snap.pages.items():
                evictable[group] += len(pages)
        elif snap is not None and snap.tier is Tier.HOST and not node.host_refs:
            # cache on the host tier: a request whose recovery failed, or that was
            # aborted while retracted, leaves it there for a later match to load
            for group, pages in snap.pages.items():
                host_cached[group] += len(pages)
    out = {}
    for group, pool in view.pools.items():
        counts = np.bincount(pool.owner_kind, minlength=len(OwnerKind)).tolist()
        by_owner = {label: counts[int(kind)] for kind, label in OWNER_LABEL.items()}
        host = view.host_pools.get(group)
        by_owner["host"] = host.used_count if host else 0
        by_owner["host_evictable"] = host_cached[group]
        spec = view.config.group(group)
        out[group] = GroupUsage(
            group=group,
            family=str(spec.family),
            capacity=pool.capacity,
            free=pool.free_count,
            by_owner=by_owner,
            evictable=evictable[group],
            host_capacity=spec.host_capacity,
        )
    return out


class _LiveHolders(NamedTuple):
    """The holders a bound is computed for, at one moment."""

    active: list[Holder]  # running, or a session parked between turns
    retracted: list[Holder]
    slack_tokens: int
    stored: list  # the backend's whole-state snapshots (slots)

    @property
    def count(self) -> int:
        return len(self.active) + len(self.retracted)

    def ahead(self, h: Holder) -> int:
        """Tokens a holder may hold pages for beyond what it computed: the step's
        slack; a parked slot also keeps what was placed for a step it never ran
        (pushed out mid-step), until it resumes and frees that tail."""
        if h.status is HolderStatus.PARKED:
            return max(self.slack_tokens, h.allocated_len - h.computed_len)
        return self.slack_tokens


def usage_bounds(
    view: CacheView,
    slack_tokens: int = 0,
    usage: dict[str, GroupUsage] | None = None,
) -> dict[str, Bound]:
    """Pinned pages against the limit live holders justify, per device group.

    ``slack_tokens`` is how far a holder may legitimately allocate ahead of
    its computed tokens at a step boundary (k + 1 with speculative decoding).
    ``usage`` is this same moment's ``group_usage``, when the caller has it.
    """
    holders = view.holders.values()
    live = _LiveHolders(
        active=[h for h in holders if h.status in (HolderStatus.ACTIVE, HolderStatus.PARKED)],
        retracted=[h for h in holders if h.status is HolderStatus.RETRACTED],
        slack_tokens=slack_tokens,
        stored=view.stored.snapshots(),
    )
    usage = usage if usage is not None else group_usage(view)
    out = {FULL_KV: _full_bound(view, live, usage[FULL_KV])}
    out[SWA_KV] = _swa_bound(view, live, usage[SWA_KV])
    for group in STATE_GROUPS:
        out[group] = _state_bound(view, live, group)
    return out


def _full_bound(view: CacheView, live: _LiveHolders, full: GroupUsage) -> Bound:
    p = view.page_size
    limit = sum(math.ceil((h.computed_len + live.ahead(h)) / p) for h in live.active)
    limit += sum(h.anchor.depth // p for h in live.retracted if h.anchor is not None)
    limit += sum(math.ceil(s.length / p) for s in live.stored)
    limit += sum(
        math.ceil(pend.boundary / p)
        for h in live.active
        for pend in h.pending.values()
        if pend.kind is PendingKind.SLOT
    )
    # stored slots count against the limit above, so not as evictable here either
    tree_evictable = full.evictable - view.stored.evictable().get(FULL_KV, 0)
    pinned = full.capacity - full.free - tree_evictable
    return Bound(group=FULL_KV, pinned=pinned, limit=limit, shared=0, holders=live.count)


def _swa_bound(view: CacheView, live: _LiveHolders, swa: GroupUsage) -> Bound:
    ps = view.pools[SWA_KV].page_size
    limit = sum(math.ceil((view.config.window + live.ahead(h)) / ps) + 1 for h in live.active)
    return Bound(
        group=SWA_KV, pinned=swa.capacity - swa.free, limit=limit, shared=0, holders=live.count
    )


def _state_bound(view: CacheView, live: _LiveHolders, group: str) -> Bound:
    own = shared = 0
    kept = view.stored.kept_for_waiters()
    for node in view.tree.snapshot_nodes:
        if node.snapshot.tier is not Tier.DEVICE:
            continue
        users = node.refs + node.host_refs
        pages = len(node.snapshot.pages.get(group, ()))
        # a branch point is kept for every sibling; a kept-for-waiters node
        # for the queued requests that will branch off there
        if len(node.children) > 1 or node in kept or users > 1:
            shared += pages
        elif users == 1:
            own += pages
    for h in live.active:
        own += sum(len(pend.pages[group]) for pend in h.pending.values())
        own += len(h.working.get(group, ()))
    own += sum(len(s.pages.get(group, ())) for s in live.stored)
    sessions = sum(h.owner.kind is OwnerKind.SESSION for h in live.active)
    turn_ends = sessions * (MAX_ROLLBACK + 1)
    snapshots = live.count * SNAPSHOTS_PER_HOLDER + turn_ends + len(live.stored)
    limit = snapshots * view.config.pages_per_snapshot(group)
    limit += sum(1 for h in live.active if group in h.working)
    return Bound(group=group, pinned=own, limit=limit, shared=shared, holders=live.count)
