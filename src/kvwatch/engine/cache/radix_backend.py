"""RadixPrefixCache: the hybrid radix tree with state recovery (``mode=radix``).

``match`` locks the deepest cached node whose continuation snapshot is
complete (state recovery) and restores that state into the holder's own
working pages. Holders never write to tree pages: history pages are borrowed
read-only, and snapshots are copied in and out (``HolderPages``).
``commit_chunk`` hands computed pages and snapshots to the tree (``Commits``,
commit.py).

Parts beyond ``CacheBase``'s: ``Commits`` (the commit path and the releases
after a leave), ``Promises`` with ``RadixBranches`` (branch points kept for
queued requests, branches.py), ``RecoveryNodes`` (pressure.py), registered
with the store as its last resort, with ``Commits.release_unbranched`` for
the parents eviction leaves with one child, and ``RadixReads`` (what the
readers see beyond the tree: kept snapshots, stopped commits).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvwatch.engine.cache.base import CacheBase
from kvwatch.engine.cache.branches import RadixBranches
from kvwatch.engine.cache.commit import Commits
from kvwatch.engine.cache.deferred import mutation
from kvwatch.engine.cache.holder import Holder, HolderStatus, PendingKind
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import OwnerKind
from kvwatch.engine.cache.pool import PoolExhausted
from kvwatch.engine.cache.pressure import RecoveryNodes
from kvwatch.engine.cache.promises import Promises
from kvwatch.engine.cache.protocol import Handle, Match, holder_of
from kvwatch.engine.cache.radix import Walk
from kvwatch.engine.cache.tree_events import acting
from kvwatch.engine.cache.view import StoredReads
from kvwatch.engine.faults import Fault


class RadixPrefixCache(CacheBase):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._promises = Promises()
        self._commits = Commits(
            self._store,
            self._pages.full,
            self._holders.records,
            self._promises,
            self._events,
            self._faults,
        )
        self._branches = RadixBranches(
            self._promises, self._commits, self._store.tree, self._events
        )
        self._stored = RadixReads(self._promises, self._holders.records, self.page_size)
        self._store.reclaimers.append(RecoveryNodes(self._store, self._holders.records))
        if Fault.INTERIOR_SNAPSHOT_LEAK not in self._faults:
            self._store.on_unbranched = self._commits.release_unbranched

    # -- match and state recovery ---------------------------------------------------
    @mutation
    def match(self, h: Handle) -> Match:
        """Lock the deepest usable cached prefix of the holder's tokens and restore it.

        At least one token is left to compute, so the last prompt token always
        produces logits. Raises ``PoolExhausted`` (holding nothing new) when
        the working pages cannot be allocated.
        """
        holder = self._matchable(h)
        with acting(self._store.tree, holder.id, holder.label):
            return self._match(holder)

    def _match(self, holder: Holder) -> Match:
        tree = self._store.tree
        walk = self._walk(holder)
        anchor = self._lock_on_descent(walk)
        try:
            self._activate(holder, anchor)
        except PoolExhausted:
            if anchor is not None:
                tree.unlock(anchor)
            raise
        if holder.anchor is not None:  # recovered: the host ref has served its purpose
            tree.drop_host_ref(holder.anchor)
            holder.anchor = None
        # The tree has history to walk.hit_len but no state there: the holder
        # recomputes through that depth, so it captures the state others need.
        holder.branch_at = walk.hit_len if walk.hit_len > holder.cached_len else 0
        reach = tree.reach(holder.tokens, holder.extra_key, walk, len(holder.tokens))
        return Match(walk.hit_len, holder.cached_len, reach)

    def _walk(self, holder: Holder) -> Walk:
        """The tree's walk along the holder's tokens but the last (pure here)."""
        return self._store.tree.walk(holder.tokens, holder.extra_key, len(holder.tokens) - 1)

    def _lock_on_descent(self, walk: Walk) -> Node | None:
        """Take refs top-down along the walk, then trim back to a usable snapshot.

        The descent refs the root first. State recovery trims every node below
        the deepest complete snapshot; when nothing is left (a miss, or a
        trim-to-empty) the root ref must go too, or it drifts up by one per
        miss (seed 002). When that snapshot is on the device, nothing can
        change while choosing it, so only the kept path is locked, directly.
        Loading one from the host allocates, which may evict: the whole walk
        is locked first so that nothing on it goes.
        """
        tree = self._store.tree
        keep = len(walk.nodes)
        while keep and not walk.nodes[keep - 1].has_complete_snapshot:
            keep -= 1
        if keep and walk.nodes[keep - 1].snapshot.tier is Tier.DEVICE:
            tree.lock_used(walk.nodes[:keep])
            return walk.nodes[keep - 1]
        if keep:
            keep = self._lock_then_load(walk)
        else:  # a miss: the descent's root ref, given back
            tree.inc(tree.root)
            if Fault.ROOT_REF_LEAK_ON_MISS not in self._faults:
                tree.dec(tree.root)
        if keep == 0:
            return None
        anchor = walk.nodes[keep - 1]
        tree.touch(anchor)
        return anchor

    def _lock_then_load(self, walk: Walk) -> int:
        """The descent with a host snapshot to load: lock the whole walk, trim
        back to a usable snapshot; how many nodes stay locked."""
        tree = self._store.tree
        tree.inc(tree.root)
        for node in walk.nodes:
            tree.inc(node)
        keep = len(walk.nodes)
        while keep and not self._usable(walk.nodes[keep - 1]):
            keep -= 1
        for node in reversed(walk.nodes[keep:]):
            tree.dec(node)
        if keep == 0 and Fault.ROOT_REF_LEAK_ON_MISS not in self._faults:
            tree.dec(tree.root)
        return keep

    def _usable(self, node: Node) -> bool:
        if not node.has_complete_snapshot:
            return False
        return node.snapshot.tier is Tier.DEVICE or self._store.load(node)

    def _activate(self, holder: Holder, anchor: Node | None) -> None:
        """Give a holder its working pages and restore ``anchor``'s state into them.

        Its full.kv prefix [0, d) is the anchor's path, borrowed::

            tree    root ── [0, 64) ── [64, d)*      * the anchor, locked
            holder  full_pages = pages of [0, 64) + [64, d); own pages from d on
        """
        d = self._borrow_path(holder, anchor)
        self._pages.restore(holder, anchor.snapshot.pages if anchor else None, d)

    def _borrow_path(self, holder: Holder, anchor: Node | None) -> int:
        """Working pages for the holder, the anchor's path as its full.kv prefix, the
        holder active from there; the anchor's depth."""
        d = anchor.depth if anchor is not None else 0
        self._pages.give_working(holder, d)
        if anchor is not None:
            self._pages.full.borrow(holder, anchor)
        holder.lock_node = anchor
        holder.cached_len = holder.computed_len = holder.allocated_len = d
        holder.status = HolderStatus.ACTIVE
        return d

    # -- captures and commits ---------------------------------------------------------
    def capture_points(self, h: Handle, start: int, end: int) -> list[tuple[int, PendingKind]]:
        """Boundaries in (start, end] where the runner must capture state.

        Every multiple of ``snapshot_interval``, the holder's ``branch_at``
        (the depth where its prompt left the tree with no state to resume
        from; a branch point, so kept for siblings) and promised points
        (where queued requests wait to branch off), plus the last page boundary
        (the TRACK that follows the frontier and ends a turn). A session
        commits nothing until it closes, so it only keeps the TRACK.
        """
        holder = holder_of(h)
        p = self.page_size
        session = holder.owner.kind is OwnerKind.SESSION
        interval = self._config.snapshot_interval
        intervals = (
            [] if session else range(-(-(start + 1) // interval) * interval, end + 1, interval)
        )
        points = dict.fromkeys(intervals, PendingKind.INTERVAL)
        if not session:
            for b in (holder.branch_at, *self._promises.promised_by(holder.id)):
                if start < b <= end:
                    points.setdefault(b, PendingKind.BRANCH)
        last = end - end % p
        if last > start:
            points.setdefault(last, PendingKind.TRACK)
        return list(points.items())

    @mutation
    def commit_chunk(self, h: Handle, terminal: bool = False) -> int:
        return self._commits.commit_chunk(holder_of(h), terminal)

    def _finish(self, holder: Holder) -> None:
        self._commits.insert(holder, terminal=True)

    def _retract_anchor(self, holder: Holder) -> Node | None:
        """Commit (the frontier snapshot included), then keep a host ref on the
        deepest complete snapshot; it moves to the host tier once no running
        holder uses it (``CacheBase.retract``)."""
        self._commits.commit_chunk(holder, terminal=True)
        if holder.lock_node is None:
            return None
        anchor = next((n for n in holder.lock_node.path() if n.has_complete_snapshot), None)
        if anchor is not None:
            self._store.tree.add_host_ref(anchor)
        return anchor

    def _left_path(self, path: list[Node]) -> None:
        """A snapshot the leaver shared is now one holder's alone: if superseded
        on that holder's path it goes now, not at that holder's next commit."""
        if Fault.INTERIOR_SNAPSHOT_LEAK not in self._faults:
            self._commits.release_for_sharers(path)


class RadixReads(StoredReads):
    """What the radix backend shows the readers beyond its tree and holders."""

    def __init__(self, promises: Promises, holders: Mapping[int, Holder], page_size: int) -> None:
        self._promises = promises
        self._holders = holders
        self._page_size = page_size

    def kept_for_waiters(self) -> frozenset[Node]:
        return self._promises.kept

    def stopped_commits(self) -> list[str]:
        """Running requests whose commit stopped short of the pages they computed.

        A probe runs at a step boundary, and every step ends with ``commit_chunk``
        for each request it computed, which reaches the last full page computed.
        A request still short of it was stopped by a node on its path (the
        history-only anchor of seed 000) and keeps those pages to itself.
        """
        p, out = self._page_size, []
        for h in self._holders.values():
            committable = h.computed_len - h.computed_len % p
            running = h.status is HolderStatus.ACTIVE and h.owner.kind is OwnerKind.REQUEST
            if running and h.cached_len < committable:
                out.append(f"{h.owner}: commit stopped at {h.cached_len} of {committable} tokens")
        return out
