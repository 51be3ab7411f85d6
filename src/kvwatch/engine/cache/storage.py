"""CacheStorage: the pools, the tree, and what happens under pool pressure.

Everything here is about pages, not requests: allocating with eviction and
pruning as fallbacks, freeing a node's pages, and moving a snapshot between the
device and host tiers. A backend (``RadixPrefixCache``, ``SlotPrefixCache``)
owns one and builds the request lifecycle on top of it.

A page has one way in and one way out, both here: ``alloc`` / ``alloc_groups``
take pages from a pool, and the exits (``free_pages``, ``free_groups``,
``transfer_pages``) give them back or hand them to another owner. No other
module calls a pool's ``free`` or ``transfer``: the per-group classes
(full_attention.py, sliding_window.py, linear_state.py) keep holders' tables
and give pages back through these exits.

Pressure order for one group (``alloc``):

1. free pages;
2. state groups only: prune snapshots of unreferenced nodes, oldest first
   (the node keeps its history and becomes a history-only anchor);
3. evict unreferenced leaves, oldest first (frees history and state);
4. the backend's reclaimers, in the order it registered them (retracted
   holders' recovery nodes, slot snapshots: see ``Reclaimer``);
5. raise ``PoolExhausted``. The scheduler then retracts; the cache never
   raises anything else on a shortage.

Every allocation names its ``Site`` (failpoints.py), where a failpoint
schedule may fail it first, as if steps 2 to 4 had freed nothing.

Eviction can leave a parent with one child; ``on_unbranched`` (set by the
radix backend) then decides about that parent's state.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

from kvwatch.engine.cache.failpoints import Failpoints, Site
from kvwatch.engine.cache.node import Node, Snapshot, Tier
from kvwatch.engine.cache.owner import Owner
from kvwatch.engine.cache.pool import PageIds, PageLayout, PagePool, PoolExhausted
from kvwatch.engine.cache.radix import TREE_OWNER, RadixTree
from kvwatch.engine.config import FULL_KV, STATE_GROUPS, CacheConfig, Family, GroupSpec
from kvwatch.engine.events import EventBus, NodeEvicted, SnapshotMoved, SnapshotReleased
from kvwatch.engine.faults import Fault

DEFAULT_LAYOUT = PageLayout((), torch.float32)
Released = dict[tuple[str, Tier], list[np.ndarray]]  # pages an eviction frees, by group and tier


class Reclaimer(Protocol):
    """A last resort under pressure: free ``wanted`` pages of ``group`` if it can."""

    def __call__(self, group: str, wanted: int, tier: Tier) -> int: ...


class FailpointExhausted(PoolExhausted):
    """What a full pool raises at an allocation site, raised by its failpoint:
    callers handle it as the real one, and its message says which failpoint."""

    def __init__(self, pool: PagePool, needed: int, site: Site, hit: int) -> None:
        super().__init__(pool.group, needed, pool.free_count, pool.capacity, pool.tier)
        self.site = site
        self.args = (f"{self.args[0]} (failpoint {site}, hit {hit})",)


class CacheStorage:
    def __init__(
        self,
        config: CacheConfig,
        layouts: Mapping[str, PageLayout] | None = None,
        *,
        faults: frozenset[Fault] = frozenset(),
        device: str | torch.device = "cpu",
        events: EventBus | None = None,
    ) -> None:
        layouts = layouts or {}
        self.config = config
        self.faults = faults
        self.events = events or EventBus()
        self.page_size = config.page_size

        def pool(spec: GroupSpec, tier: Tier) -> PagePool:
            capacity = spec.capacity if tier is Tier.DEVICE else spec.host_capacity
            layout = layouts.get(spec.name, DEFAULT_LAYOUT)
            where = device if tier is Tier.DEVICE else "cpu"
            return PagePool(spec.name, spec.page_size, capacity, layout, device=where, tier=tier)

        self.pools = {spec.name: pool(spec, Tier.DEVICE) for spec in config.groups}
        self.host_pools = {
            spec.name: pool(spec, Tier.HOST) for spec in config.groups if spec.host_capacity
        }
        self.tree = RadixTree(self.page_size, faults, self.events)
        self.failpoints = Failpoints(config.failpoints, self.events)
        self.reclaimers: list[Reclaimer] = []  # after prune and evict, in order
        # eviction left these parents (group): returns the group's pages freed
        self.on_unbranched: Callable[[list[Node], str], int] | None = None

    def pool(self, group: str, tier: Tier = Tier.DEVICE) -> PagePool:
        return self.pools[group] if tier is Tier.DEVICE else self.host_pools[group]

    # -- allocation under pressure ------------------------------------------------
    def alloc(self, group: str, n: int, owner: Owner, *, site: Site) -> np.ndarray:
        """``n`` device pages of ``group`` for ``owner``, making room as the module
        docstring says; ``PoolExhausted`` allocates nothing."""
        if self.failpoints.failing_group(site, {group: n}) is not None:
            raise self._failed(self.pools[group], n, site)
        return self._alloc(group, n, owner)

    def _alloc(self, group: str, n: int, owner: Owner) -> np.ndarray:
        pool = self.pools[group]
        if pool.free_count < n:
            self.make_room(group, n - pool.free_count)
        return pool.alloc(n, owner)

    def _failed(self, pool: PagePool, n: int, site: Site) -> FailpointExhausted:
        return FailpointExhausted(pool, n, site, self.failpoints.hits.get(site, 0))

    def alloc_groups(
        self, counts: Mapping[str, int], owner: Owner, *, site: Site
    ) -> dict[str, np.ndarray]:
        """Allocate in several groups at once: all of it, or nothing."""
        failing = self.failpoints.failing_group(site, counts)
        got: dict[str, np.ndarray] = {}
        try:
            for group, n in counts.items():
                if group == failing:
                    raise self._failed(self.pools[group], n, site)
                got[group] = self._alloc(group, n, owner)
        except PoolExhausted:
            for group, pages in got.items():
                self.free_pages(group, pages, owner)
            raise
        return got

    # -- exits: every page leaves its owner here ------------------------------------
    # A release cannot fail for want of room, so no failpoint ``Site`` sits here.
    # Each exit names the owner it takes the pages from, and the pool checks it:
    # a page freed twice, or by an owner that does not hold it, raises
    # ``OwnershipError`` and changes nothing.
    def free_pages(
        self, group: str, pages: PageIds | Sequence[int], owner: Owner, tier: Tier = Tier.DEVICE
    ) -> None:
        """Give ``owner``'s ``pages`` of ``group`` back to the ``tier`` pool's free stack.

        Keeps the pool's invariant that a page is on the free stack exactly
        when it is tagged free, and once: every release of a page goes through
        here, so none can skip the ownership check. No pages, no change.
        """
        self.pool(group, tier).free(pages, owner)

    def free_groups(self, pages: Mapping[str, np.ndarray], owner: Owner, tier: Tier) -> None:
        """``free_pages`` for each group of ``pages`` (a snapshot's, a working
        state's), in the mapping's order."""
        for group, ids in pages.items():
            self.free_pages(group, ids, owner, tier)

    def transfer_pages(
        self, group: str, pages: PageIds | Sequence[int], old: Owner, new: Owner
    ) -> None:
        """Hand ``old``'s device ``pages`` of ``group`` to ``new`` without freeing them.

        The pages stay allocated throughout, so no allocation can take them
        while they change hands (a holder's pages joining the tree, a staged
        copy becoming a slot's); ``old`` must hold each page named, once.
        """
        self.pools[group].transfer(pages, old, new)

    def make_room(self, group: str, wanted: int, tier: Tier = Tier.DEVICE) -> int:
        """Free at least ``wanted`` pages of ``group`` if the cache can; returns pages freed."""
        got = self.prune_and_evict(group, wanted, tier)
        for reclaim in self.reclaimers:
            if got >= wanted:
                break
            got += reclaim(group, wanted - got, tier)
        return got

    def prune_and_evict(self, group: str, wanted: int, tier: Tier = Tier.DEVICE) -> int:
        """Steps 2 and 3 of the pressure order; returns pages of ``group`` freed."""
        got = 0
        if self.config.group(group).family is Family.STATE:
            got += self.prune(group, wanted, tier)
        if got < wanted and tier is Tier.DEVICE:
            got += self.evict(group, wanted - got)
        return got

    def evict(self, group: str, wanted: int) -> int:
        """Evict LRU unreferenced leaves until ``wanted`` pages of ``group`` are freed.

        A parent left with one child is no longer a branch point; the
        ``on_unbranched`` hook frees what that makes superseded.
        """
        parents: list[Node] = []
        freed: Released = defaultdict(list)
        victim = self._releaser(group, freed)

        def release(node: Node) -> int:
            parents.append(node.parent)
            return victim(node)

        got = self.tree.evict(wanted, release)
        self._free_released(freed)
        if self.on_unbranched is not None:
            got += self.on_unbranched(parents, group)
        return got

    def prune(
        self, group: str, wanted: int, tier: Tier = Tier.DEVICE, reason: str = "pruned"
    ) -> int:
        """Drop snapshots of unreferenced nodes, LRU first, until ``wanted`` pages are freed."""
        candidates = [
            (n.last_access, n.id, n)
            for n in self.tree.snapshot_nodes
            if n.refs == 0 and n.host_refs == 0 and n.snapshot.tier is tier
        ]
        heapq.heapify(candidates)
        got = 0
        while got < wanted and candidates:
            node = heapq.heappop(candidates)[2]
            got += len(node.snapshot.pages.get(group, ()))
            self.drop_snapshot(node, reason)
        return got

    def flush(self) -> None:
        """Evict every unreferenced node and prune every unreferenced snapshot."""
        freed: Released = defaultdict(list)
        self.tree.evict_all(self._releaser(FULL_KV, freed, reason="flushed"))
        self._free_released(freed)
        for tier in (Tier.DEVICE, Tier.HOST):
            for group in STATE_GROUPS:
                self.prune(group, self.pool_capacity(group, tier), tier, reason="flushed")

    def pool_capacity(self, group: str, tier: Tier) -> int:
        pools = self.pools if tier is Tier.DEVICE else self.host_pools
        return pools[group].capacity if group in pools else 0

    # -- node pages ---------------------------------------------------------------
    def _releaser(
        self, group: str, freed: Released, reason: str = "evicted"
    ) -> Callable[[Node], int]:
        """The callback that releases an eviction walk's victims, one at a time.

        ``release(node)`` detaches the victim's snapshot and counts its pages of
        ``group``; its pages, history and state, join ``freed``, which the
        caller frees in one call per group once the walk is over (nothing
        allocates during it). ``NodeEvicted`` (its page ids and path key) is
        built only when a listener subscribes, asked once per walk (inside a
        mutation no handler runs before the walk is over; outside one, a handler
        that subscribes during the walk sees the next walk's events).
        """
        history = freed[FULL_KV, Tier.DEVICE]
        counts_history = group == FULL_KV
        emit = self.events.emit if self.events.listens(NodeEvicted) else None
        keys: dict[Node, int] = {}  # path keys found so far (``RadixTree.path_key``)
        path_key = self.tree.path_key

        def release(node: Node) -> int:
            pages, snap = node.pages, node.snapshot
            counted = len(pages) if counts_history else 0
            if snap is not None and snap.pages:  # not history-only
                counted += len(snap.pages.get(group, ()))
                self.drop_snapshot(node, reason, freed)
            history.append(pages)
            if emit is not None:
                ids, key = tuple(pages.tolist()), path_key(node, keys)
                emit(NodeEvicted(node_id=node.id, depth=node.depth, page_ids=ids, path_key=key))
            return counted

        return release

    def _free_released(self, freed: Released) -> None:
        for (group, tier), pages in freed.items():
            if pages:  # the history list is there from the walk's start
                self.free_pages(group, np.concatenate(pages), TREE_OWNER, tier)

    def drop_snapshot(self, node: Node, reason: str, into: Released | None = None) -> None:
        """Free a node's state pages (``into``: leave them there, for the caller
        to free); the node keeps its history (history-only)."""
        taken = self.tree.detach_state(node)
        if into is None:
            self.free_groups(taken.pages, TREE_OWNER, taken.tier)
        else:
            for group, ids in taken.pages.items():
                into[group, taken.tier].append(ids)
        if self.events.listens(SnapshotReleased):
            self.events.emit(SnapshotReleased(node.id, node.depth, reason))

    def give_state(self, node: Node, pages: Mapping[str, np.ndarray], owner: Owner) -> None:
        """Hand a holder's device state pages to ``node`` (ownership moves to the tree)."""
        for group, ids in pages.items():
            self.transfer_pages(group, ids, owner, TREE_OWNER)
            self.tree.attach_state(node, group, ids, Tier.DEVICE)

    # -- tiers --------------------------------------------------------------------
    def offload(self, node: Node) -> bool:
        """Move a complete device snapshot to the host tier, if the host has room."""
        snap = node.snapshot
        assert snap is not None and snap.complete and snap.tier is Tier.DEVICE
        if not all(g in self.host_pools for g in snap.pages):
            return False
        return self._move(node, snap, Tier.HOST)

    def load(self, node: Node) -> bool:
        """Bring a host-tier snapshot back to the device; False if the device is full."""
        snap = node.snapshot
        assert snap is not None and snap.complete and snap.tier is Tier.HOST
        return self._move(node, snap, Tier.DEVICE)

    def _move(self, node: Node, snap: Snapshot, tier: Tier) -> bool:
        dst = self._alloc_move(snap, tier)
        if dst is None:
            return False
        taken = self.tree.detach_state(node)
        for group, src in taken.pages.items():
            self.pool(group, taken.tier).copy_pages(src, self.pool(group, tier), dst[group])
        self.free_groups(taken.pages, TREE_OWNER, taken.tier)
        for group, ids in dst.items():
            self.tree.attach_state(node, group, ids, tier)
        self.events.emit(SnapshotMoved(node.id, node.depth, str(tier)))
        return True

    def _alloc_move(self, snap: Snapshot, tier: Tier) -> dict[str, np.ndarray] | None:
        """Pages in ``tier`` for a copy of ``snap``; None (holding nothing) if short."""
        site = Site.TIER_LOAD if tier is Tier.DEVICE else Site.TIER_OFFLOAD
        failing = self.failpoints.failing_group(site, {g: len(p) for g, p in snap.pages.items()})
        dst: dict[str, np.ndarray] = {}
        try:
            for group, src in snap.pages.items():
                pool = self.pool(group, tier)
                if group == failing:
                    raise self._failed(pool, len(src), site)
                if pool.free_count < len(src):
                    self.make_room(group, len(src) - pool.free_count, tier)
                dst[group] = pool.alloc(len(src), TREE_OWNER)
        except PoolExhausted:
            self.free_groups(dst, TREE_OWNER, tier)
            return None
        return dst
