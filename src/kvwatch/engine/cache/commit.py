"""commit_chunk: hand a holder's computed pages and snapshots to the tree.

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
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from kvwatch.engine.cache.holder import Holder, HolderStatus, PendingKind
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import OwnerKind
from kvwatch.engine.cache.radix import TREE_OWNER
from kvwatch.engine.config import FULL_KV
from kvwatch.engine.events import SnapshotTaken
from kvwatch.engine.faults import Fault

if TYPE_CHECKING:
    from kvwatch.engine.cache.radix_cache import RadixPrefixCache


def commit_chunk(cache: RadixPrefixCache, holder: Holder, terminal: bool = False) -> int:
    """Commit what ``holder`` has computed; returns how many tokens joined its cached prefix.

    With ``terminal`` the frontier snapshot (the TRACK) is committed too: a turn
    ends, and the next turn should resume exactly here. A session commits
    nothing until it closes (``insert``): its slot keeps its own pages.
    """
    if holder.owner.kind is OwnerKind.SESSION:
        return 0
    return insert(cache, holder, terminal)


def insert(cache: RadixPrefixCache, holder: Holder, terminal: bool) -> int:
    if holder.status is not HolderStatus.ACTIVE:
        return 0
    before = holder.cached_len
    if terminal and (track := holder.track()) is not None:
        track.kind = PendingKind.TERMINAL
    _extend(cache, holder)
    _attach_pending(cache, holder)
    if holder.lock_node is not None:
        cache.store.tree.touch(holder.lock_node)
    if Fault.INTERIOR_SNAPSHOT_LEAK not in cache.faults:
        release_superseded(cache, holder)
    return holder.cached_len - before


def _extend(cache: RadixPrefixCache, holder: Holder) -> None:
    """Pass 1. The holder's copies of pages the tree already has are gathered
    over the whole pass and freed in one ownership-checked call at its end:
    nothing in the pass allocates, and those pages are no longer on its table."""
    copies: list[int] = []
    _extend_over(cache, holder, copies)
    cache.store.free_pages(FULL_KV, copies, holder.owner)


def _extend_over(cache: RadixPrefixCache, holder: Holder, copies: list[int]) -> None:
    tree, p = cache.store.tree, cache.page_size
    end = holder.computed_len - holder.computed_len % p
    node = holder.lock_node or tree.root
    pos = holder.cached_len
    while pos < end:
        child = tree.child(node, holder.extra_key, holder.tokens, pos)
        if child is None:
            child = _new_leaf(cache, holder, node, pos, end)
        else:
            n = tree.matching_pages(child, holder.tokens, pos, end)
            if n * p < len(child.tokens):
                child = tree.split(child, n)
            if not _adoptable(cache, child):
                return  # the commit stops here; everything beyond stays the holder's
            _adopt_history(cache, holder, child, copies)
        _step_lock(cache, holder, child)
        node, pos = child, child.depth


def _new_leaf(cache: RadixPrefixCache, holder: Holder, parent: Node, pos: int, end: int) -> Node:
    p = cache.page_size
    pages = np.array(holder.full_pages[pos // p : end // p], dtype=np.int64)
    cache.store.transfer_pages(FULL_KV, pages, holder.owner, TREE_OWNER)
    return cache.store.tree.add_leaf(parent, holder.tokens[pos:end], pages, holder.extra_key)


def _adoptable(cache: RadixPrefixCache, node: Node) -> bool:
    """Whether the commit may pass through an existing node.

    It always may: a history-only node is filled or skipped later. With the
    ``history-only-anchor`` fault, a node whose snapshot record lacks state
    blocks the commit, as in the seed-000 engine's adopt helper.
    """
    snap = node.snapshot
    if snap is None or snap.complete:
        return True
    return Fault.HISTORY_ONLY_ANCHOR not in cache.faults


def _adopt_history(cache: RadixPrefixCache, holder: Holder, node: Node, copies: list[int]) -> None:
    """Swap the holder's copies of ``node``'s pages for the tree's own; the
    copies join ``copies``, to be freed (``_extend``)."""
    p = cache.page_size
    a, b = node.start // p, node.depth // p
    tree_pages = node.pages.tolist()
    mine = holder.full_pages[a:b]
    if mine != tree_pages:
        copies += mine
        holder.full_pages[a:b] = tree_pages


def _step_lock(cache: RadixPrefixCache, holder: Holder, child: Node) -> None:
    """Move the holder's lock one node down: a lock on ``child`` covers its parent's path."""
    if holder.lock_node is None:
        cache.store.tree.inc(cache.store.tree.root)
    cache.store.tree.inc(child)
    holder.lock_node = child
    holder.cached_len = child.depth


def _attach_pending(cache: RadixPrefixCache, holder: Holder) -> None:
    ready = sorted(
        b
        for b, pend in holder.pending.items()
        if pend.kind is not PendingKind.TRACK and b <= holder.cached_len
    )
    for b in ready:
        pend = holder.pending.pop(b)
        node = _node_ending_at(cache, holder, b)
        snap = node.snapshot
        if snap is None or snap.history_only:
            cache.store.give_state(node, pend.pages, holder.owner)
            kind = "fill" if snap is not None else str(pend.kind)
            cache.events.emit(SnapshotTaken(node.id, node.depth, kind))
        else:  # the node already has this boundary's state; ours is a duplicate
            assert snap.complete, "state groups are always released together"
            cache.store.free_groups(pend.pages, holder.owner, Tier.DEVICE)


def _node_ending_at(cache: RadixPrefixCache, holder: Holder, b: int) -> Node:
    """The node on the holder's locked path that ends at ``b``, splitting one if needed."""
    assert holder.lock_node is not None and 0 < b <= holder.cached_len
    for node in holder.lock_node.path():
        if node.start < b <= node.depth:
            if node.depth == b:
                return node
            return cache.store.tree.split(node, (b - node.start) // cache.page_size)
    raise AssertionError(f"boundary {b} is not on the holder's path")


def release_superseded(cache: RadixPrefixCache, holder: Holder) -> None:
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
      branch off there. The node is kept (``kept_for_waiters``) until the
      promise lapses, and ``RadixPrefixCache.promise`` decides again then.

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
        if node.host_refs and Fault.SNAPSHOT_RELEASE_IGNORES_HOST_REFS not in cache.faults:
            continue
        if node.depth in cache.promises.promised_by(holder.id):
            cache.promises.keep(node)
            continue
        cache.store.drop_snapshot(node, "superseded")


def release_for_sharers(cache: RadixPrefixCache, path: list[Node]) -> None:
    """A holder left ``path``: snapshots it shared are now one holder's alone.

    Each active holder whose locked path runs through such a node releases
    what is superseded on it now, rather than at its next commit.
    """
    lone = {n for n in path if n.refs == 1 and n.snapshot is not None}
    if not lone:
        return
    for other in list(cache.holders.values()):
        if (
            other.status is HolderStatus.ACTIVE
            and other.lock_node is not None
            and any(n in lone for n in other.lock_node.path())
        ):
            release_superseded(cache, other)


def release_unbranched(cache: RadixPrefixCache, parents: list[Node], group: str) -> int:
    """Eviction left these parents: those down to one child are no branch point
    any more (``release_lone``). Returns the ``group`` pages freed."""
    return release_lone(cache, parents)[group]


def release_lone(cache: RadixPrefixCache, nodes: list[Node]) -> Counter[str]:
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
            cache.store.drop_snapshot(node, "superseded")
    release_for_sharers(cache, lone)
    return freed
