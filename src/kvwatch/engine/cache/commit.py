"""Commits: hand a holder's computed pages and snapshots to the tree.

One commit runs three passes::

    1. extend     insert tokens [cached_len, end) page-aligned, end = computed_len // P * P.
                  Where the tree already has them, *adopt*: free the holder's
                  duplicate pages and borrow the tree's instead. The lock walks
                  down with the insert, so lock_node.depth == cached_len after.
    2. attach     every pending snapshot at a boundary b <= cached_len goes to
                  the node that ends at b (splitting a node if b falls inside
                  it); where that node already has its state, ours is freed.
    3. release    superseded interior snapshots on the holder's path are freed
                  (seed 000): see ``release_superseded``.

Adoption and history-only anchors (seed 000, second review comment): a node
whose state was released keeps an empty snapshot record. Extending through it
must not stop: its missing state is *filled* in pass 2 when the holder has a
snapshot at that boundary, and *skipped* otherwise.

The radix backend owns one ``Commits`` over its store, its ``full.kv`` pages
(``FullAttentionPages``: which pages a node takes and which it adopts), its
holders and its promises; nothing here calls back into the backend.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from kvwatch.engine.cache.full_attention import FullAttentionPages
from kvwatch.engine.cache.holder import Holder, HolderStatus, PendingKind
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import OwnerKind
from kvwatch.engine.cache.promises import Promises
from kvwatch.engine.cache.storage import CacheStorage
from kvwatch.engine.cache.tree_events import acting
from kvwatch.engine.events import EventBus, SnapshotTaken
from kvwatch.engine.faults import Fault


class Commits:
    """The commit path of one radix backend, and the releases that follow a leave."""

    def __init__(
        self,
        store: CacheStorage,
        full: FullAttentionPages,
        holders: Mapping[int, Holder],
        promises: Promises,
        events: EventBus,
        faults: frozenset[Fault],
    ) -> None:
        self.store = store
        self.tree = store.tree
        self.full = full
        self.holders = holders
        self.promises = promises
        self.events = events
        self.faults = faults
        self.page_size = store.page_size

    def commit_chunk(self, holder: Holder, terminal: bool = False) -> int:
        """Commit what ``holder`` has computed; returns how many tokens joined its cached prefix.

        With ``terminal`` the frontier snapshot (the TRACK) is committed too: a turn
        ends, and the next turn should resume exactly here. A session commits
        nothing until it closes (``insert``): its slot keeps its own pages.
        """
        if holder.owner.kind is OwnerKind.SESSION:
            return 0
        return self.insert(holder, terminal)

    def insert(self, holder: Holder, terminal: bool) -> int:
        if holder.status is not HolderStatus.ACTIVE:
            return 0
        with acting(self.tree, holder.id, holder.label):
            return self._insert(holder, terminal)

    def _insert(self, holder: Holder, terminal: bool) -> int:
        before = holder.cached_len
        if terminal and (track := holder.track()) is not None:
            track.kind = PendingKind.TERMINAL
        self._extend(holder)
        self._attach_pending(holder)
        if holder.lock_node is not None:
            self.tree.touch(holder.lock_node)
        if Fault.INTERIOR_SNAPSHOT_LEAK not in self.faults:
            self.release_superseded(holder)
        return holder.cached_len - before

    # -- pass 1: extend ---------------------------------------------------------------
    def _extend(self, holder: Holder) -> None:
        """Pass 1. The holder's copies of pages the tree already has are gathered
        over the whole pass and freed in one ownership-checked call at its end:
        nothing in the pass allocates, and those pages are no longer on its table."""
        copies: list[int] = []
        self._extend_over(holder, copies)
        self.full.free_copies(holder, copies)

    def _extend_over(self, holder: Holder, copies: list[int]) -> None:
        tree, p = self.tree, self.page_size
        end = holder.computed_len - holder.computed_len % p
        node = holder.lock_node or tree.root
        pos = holder.cached_len
        while pos < end:
            child = tree.child(node, holder.extra_key, holder.tokens, pos)
            if child is None:
                child = self._new_leaf(holder, node, pos, end)
            else:
                n = tree.matching_pages(child, holder.tokens, pos, end)
                if n * p < len(child.tokens):
                    child = tree.split(child, n)
                if not self._adoptable(child):
                    return  # the commit stops here; everything beyond stays the holder's
                self.full.adopt(holder, child, copies)
            self._step_lock(holder, child)
            node, pos = child, child.depth

    def _new_leaf(self, holder: Holder, parent: Node, pos: int, end: int) -> Node:
        pages = self.full.hand_to_tree(holder, pos, end)
        return self.tree.add_leaf(parent, holder.tokens[pos:end], pages, holder.extra_key)

    def _adoptable(self, node: Node) -> bool:
        """Whether the commit may pass through an existing node.

        It always may: a history-only node is filled or skipped later. With the
        ``history-only-anchor`` fault, a node whose snapshot record lacks state
        blocks the commit, as in the seed-000 engine's adopt helper.
        """
        snap = node.snapshot
        if snap is None or snap.complete:
            return True
        return Fault.HISTORY_ONLY_ANCHOR not in self.faults

    def _step_lock(self, holder: Holder, child: Node) -> None:
        """Move the holder's lock one node down: a lock on ``child`` covers its parent's path."""
        if holder.lock_node is None:
            self.tree.inc(self.tree.root)
        self.tree.inc(child)
        holder.lock_node = child
        holder.cached_len = child.depth

    # -- pass 2: attach ---------------------------------------------------------------
    def _attach_pending(self, holder: Holder) -> None:
        ready = sorted(
            b
            for b, pend in holder.pending.items()
            if pend.kind is not PendingKind.TRACK and b <= holder.cached_len
        )
        for b in ready:
            pend = holder.pending.pop(b)
            node = self._node_ending_at(holder, b)
            snap = node.snapshot
            if snap is None or snap.history_only:
                self.store.give_state(node, pend.pages, holder.owner)
                kind = "fill" if snap is not None else str(pend.kind)
                self.events.emit(SnapshotTaken(node.id, node.depth, kind))
            else:  # the node already has this boundary's state; ours is a duplicate
                assert snap.complete, "state groups are always released together"
                self.store.free_groups(pend.pages, holder.owner, Tier.DEVICE)

    def _node_ending_at(self, holder: Holder, b: int) -> Node:
        """The node on the holder's locked path that ends at ``b``, splitting one if needed."""
        assert holder.lock_node is not None and 0 < b <= holder.cached_len
        for node in holder.lock_node.path():
            if node.start < b <= node.depth:
                if node.depth == b:
                    return node
                return self.tree.split(node, (b - node.start) // self.page_size)
        raise AssertionError(f"boundary {b} is not on the holder's path")

    # -- pass 3 and the releases after a leave ------------------------------------------
    def release_superseded(self, holder: Holder) -> None:
        """Free interior snapshots on the holder's path that nobody can still need.

        Walking up from the deepest node with a complete snapshot D (never touched,
        so a resume anchor always remains), an ancestor's state is freed when

        * it has one child: a branch point's state is where every sibling
          resumes, so it is not superseded by any one branch (it goes by LRU
          pruning once unlocked, like a leaf's);
        * ``refs == 1``: the holder is its only device holder. Refs never decrease
          going up a path, so the walk stops at the first shared node; shared
          snapshots stay for the sharers and go on a later commit once they leave.
        * ``host_refs == 0``: no retracted holder will recover from it (the first
          seed-000 review comment);
        * its depth is not one the holder promised: a queued request waits to
          branch off there. The node is kept (``Promises.kept``) until the
          promise lapses, and the branch promises decide again then.

        Holders copy a snapshot into their own pages when they resume and never
        borrow its pages, so no sliding-window condition is needed on top.
        """
        lock = holder.lock_node
        if lock is None:
            return
        deepest = next((n for n in lock.path() if n.has_complete_snapshot), None)
        if deepest is None or deepest.parent is None:
            return
        for node in deepest.parent.path():
            if node.is_root or node.refs > 1:
                return
            if node.snapshot is None or node.snapshot.history_only or len(node.children) > 1:
                continue
            if node.host_refs and Fault.SNAPSHOT_RELEASE_IGNORES_HOST_REFS not in self.faults:
                continue
            if node.depth in self.promises.promised_by(holder.id):
                self.promises.keep(node)
                continue
            self.store.drop_snapshot(node, "superseded")

    def release_for_sharers(self, path: list[Node]) -> None:
        """A holder left ``path``: snapshots it shared are now one holder's alone.

        Each active holder whose locked path runs through such a node releases
        what is superseded on it now, rather than at its next commit.
        """
        lone = {n for n in path if n.refs == 1 and n.snapshot is not None}
        if not lone:
            return
        for other in list(self.holders.values()):
            if (
                other.status is HolderStatus.ACTIVE
                and other.lock_node is not None
                and any(n in lone for n in other.lock_node.path())
            ):
                self.release_superseded(other)

    def release_unbranched(self, parents: list[Node], group: str) -> int:
        """Eviction left these parents: those down to one child are no branch point
        any more (``release_lone``). Returns the ``group`` pages freed."""
        return self.release_lone(parents)[group]

    def release_lone(self, nodes: list[Node]) -> Counter[str]:
        """Nodes down to one child keep state that no branch needs: it is superseded again.

        Unreferenced, it goes now; on live holders' paths, as those holders'
        release decides. Returns the pages freed, by group.
        """
        lone = [
            n
            for n in nodes
            if n.parent is not None and len(n.children) == 1 and n.has_complete_snapshot
        ]
        freed: Counter[str] = Counter()
        for node in lone:
            if node.refs == 0 and node.host_refs == 0 and node.snapshot.tier is Tier.DEVICE:
                freed.update({g: len(ids) for g, ids in node.snapshot.pages.items()})
                self.store.drop_snapshot(node, "superseded")
        self.release_for_sharers(lone)
        return freed
