"""RadixTree: a page-aligned token trie with path locks and LRU eviction.

The tree only knows structure, refs and bookkeeping counters; freeing the pages
of an evicted node is the caller's job (``evict`` hands each victim to a
callback). All tree-held pages carry the single owner tag ``TREE_OWNER``, so a
split never has to re-tag pages.

Ref counts
    ``node.refs`` counts the device holders whose lock covers the node. A lock
    covers the whole path to the root, root included, so
    ``root.refs == number of holders that hold a lock``.
    ``node.host_refs`` counts retracted holders that will recover from exactly
    this node. A node with either count above zero is never evicted and its
    snapshot is never pruned.

Eviction set
    ``evictable`` is exactly the set of non-root leaves with ``refs == 0`` and
    ``host_refs == 0``; ``_refresh`` keeps it so on every change.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from kvwatch.engine.cache.node import EMPTY_PAGES, Node, Snapshot, Tier
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.tree_events import TreeEvents
from kvwatch.engine.events import EventBus
from kvwatch.engine.faults import Fault
from kvwatch.engine.paths import path_key

TREE_OWNER = Owner(OwnerKind.NODE, 0)


class CacheInvariantError(RuntimeError):
    """The cache found its own bookkeeping broken (only reachable through a fault)."""


class Walk(NamedTuple):
    """Result of descending the tree along a token sequence.

    ``nodes`` are the fully matched nodes, root excluded, top-down. ``hit_len``
    counts matched tokens, including whole pages matched inside a final node
    that diverges (or ends the query) part-way.
    """

    nodes: list[Node]
    hit_len: int


class RadixTree:
    def __init__(
        self, page_size: int, faults: frozenset[Fault] = frozenset(), events: EventBus | None = None
    ) -> None:
        self.page_size = page_size
        self.faults = faults
        # what the index and the refs do, told to listeners (``tree_events.py``)
        self.tell = TreeEvents(events, page_size) if events is not None else None
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self.root = Node(0, None, [], EMPTY_PAGES, None, 0)
        self.evictable: set[Node] = set()
        self.snapshot_nodes: set[Node] = set()  # nodes whose snapshot holds state pages
        self.node_count = 0  # root excluded
        self.page_count = 0  # full.kv pages held by nodes
        self.state_pages: Counter[tuple[str, Tier]] = Counter()

    # -- keys and lookup --------------------------------------------------------
    def key_at(self, extra_key: str | None, tokens: list[int], pos: int) -> tuple:
        return (extra_key, *tokens[pos : pos + self.page_size])

    def key_of(self, node: Node) -> tuple:
        return self.key_at(node.extra_key, node.tokens, 0)

    def child(self, node: Node, extra_key: str | None, tokens: list[int], pos: int) -> Node | None:
        return node.children.get(self.key_at(extra_key, tokens, pos))

    def matching_pages(self, node: Node, tokens: list[int], pos: int, limit: int) -> int:
        """Leading pages of ``node.tokens`` equal to ``tokens[pos:limit]``.

        Compares slices, not pages: the whole run first (a node on the path
        matches whole), else runs of 1, 2, 4, ... pages until one differs, then
        halves that run down to the first differing page.
        """
        p, mine = self.page_size, node.tokens
        total = -(-min(len(mine), limit - pos) // p)  # pages that may match
        if total <= 0:
            return 0
        if mine[: total * p] == tokens[pos : pos + total * p]:
            return total
        lo, hi, step = 0, total, 1  # pages [0, lo) match
        while lo < total:
            hi = min(lo + step, total)
            if mine[lo * p : hi * p] != tokens[pos + lo * p : pos + hi * p]:
                break
            lo, step = hi, step * 2
        while hi - lo > 1:  # the first differing page is in [lo, hi)
            mid = (lo + hi) // 2
            if mine[lo * p : mid * p] == tokens[pos + lo * p : pos + mid * p]:
                lo = mid
            else:
                hi = mid
        return lo

    def walk(self, tokens: list[int], extra_key: str | None, limit: int) -> Walk:
        """Descend along ``tokens[:limit]`` (rounded down to a page); pure."""
        p = self.page_size
        limit -= limit % p
        node, pos, nodes = self.root, 0, []
        # how much of a node is compared before it is taken whole: all of it
        whole = p if Fault.PREFIX_MATCH_FIRST_PAGE_ONLY in self.faults else None
        while pos < limit:
            if len(node.children) == 1:  # most nodes on a path: skip building its key
                (child,) = node.children.values()
                end = pos + len(child.tokens)
                if (
                    end <= limit
                    and child.extra_key == extra_key
                    and child.tokens[:whole] == tokens[pos : end if whole is None else pos + p]
                ):
                    nodes.append(child)
                    node, pos = child, end
                    continue
            child = node.children.get((extra_key, *tokens[pos : pos + p]))
            if child is None:
                break
            end = pos + len(child.tokens)
            seen = end if whole is None else pos + p
            if end <= limit and child.tokens[:whole] == tokens[pos:seen]:  # the whole node
                nodes.append(child)
                node, pos = child, end
                continue
            pos += self.matching_pages(child, tokens, pos, limit) * p
            break
        return Walk(nodes, pos)

    def reach(self, tokens: list[int], extra_key: str | None, walk: Walk, end: int) -> int:
        """How far ``tokens[:end]`` agrees with the tree's history, to the token; pure.

        The walk's page-aligned ``hit_len``, then the agreeing tokens of the page
        where they part: in the node the walk stopped inside, else in whichever
        child of its last node agrees longest (children whose first token differs
        are skipped at one compare each).
        """
        pos = walk.hit_len
        if pos >= end:
            return end
        parent = walk.nodes[-1] if walk.nodes else self.root
        inside = self.child(parent, extra_key, tokens, parent.depth)
        if pos > parent.depth and inside is not None:
            candidates = [inside]
        else:
            candidates = [c for c in parent.children.values() if c.extra_key == extra_key]
        best = 0
        for node in candidates:
            best = max(best, _agreeing(node.tokens, pos - node.start, tokens, pos, end))
        return pos + best

    def path_key(self, node: Node, known: dict[Node, int] | None = None) -> int:
        """``paths.path_key`` of the path ``node`` lies on: its top ancestor's first page.

        ``known`` (node -> key) remembers the keys found so far for a caller that
        asks about many nodes while the tree above them does not change (an
        eviction walk): the climb stops at the first node it holds, and every
        node climbed through joins it, so the walk climbs each node once.
        """
        if known is None:
            known = {}
        climbed, top = [], node
        while top not in known and top.parent is not None and top.parent.parent is not None:
            climbed.append(top)
            top = top.parent
        key = known.get(top)
        if key is None:
            key = known[top] = path_key(top.tokens, top.extra_key, self.page_size)
        for n in climbed:
            known[n] = key
        return key

    def tick(self) -> int:
        return next(self._clock)

    def touch(self, node: Node) -> None:
        """Mark ``node`` and its ancestors as just used (LRU)."""
        now = self.tick()
        for n in node.path():
            n.last_access = now

    # -- structure --------------------------------------------------------------
    def add_leaf(
        self, parent: Node, tokens: list[int], pages: np.ndarray, extra_key: str | None
    ) -> Node:
        assert tokens and len(tokens) == len(pages) * self.page_size
        node = Node(next(self._ids), parent, tokens, pages, extra_key, self.tick())
        children = len(parent.children)
        self.link(parent, node)
        assert len(parent.children) > children, "add_leaf over an existing child"
        self.node_count += 1
        self.page_count += len(pages)
        self._refresh(node)
        self._refresh(parent)
        if self.tell is not None:
            self.tell.stored(node)
        return node

    def split(self, node: Node, n_pages: int) -> Node:
        """Cut ``node`` after ``n_pages`` pages and return the new upper half.

        before:  parent ──[s, d)──────────────► node
        after:   parent ──[s, s+k)──► upper ──[s+k, d)──► node      k = n_pages * P

        ``node`` keeps its identity, depth, snapshot and host refs (they all sit
        at its end), so holders that point at it stay valid. ``upper`` inherits
        ``refs`` because every locked path through ``node`` runs through it.
        """
        k = n_pages * self.page_size
        assert node.parent is not None and 0 < k < len(node.tokens)
        parent = node.parent
        upper = Node(
            next(self._ids),
            parent,
            node.tokens[:k],
            node.pages[:n_pages].copy(),
            node.extra_key,
            node.last_access,
        )
        upper.refs = node.refs
        self.link(parent, upper)  # same first page: replaces node
        node.tokens = node.tokens[k:]
        node.pages = node.pages[n_pages:].copy()
        self.link(upper, node)
        self.node_count += 1
        if self.tell is not None:
            self.tell.split(node, upper)
        return upper

    def link(self, parent: Node, node: Node) -> None:
        """List ``node`` below ``parent`` under the key of its first page.

        The node keeps that key (``node.key``), so the dict entry and the node
        agree by identity, and the audit checks the link without re-reading
        tokens. A node's tokens change only in ``split``, which links both
        halves again.
        """
        node.key = self.key_of(node)
        node.parent = parent
        parent.children[node.key] = node

    def remove_leaf(self, node: Node) -> None:
        """Unlink an evictable leaf; its pages must already be freed."""
        assert node.parent is not None
        self._unlink(node, node.parent)

    def _unlink(self, node: Node, parent: Node) -> None:
        snap = node.snapshot
        assert not (node.children or node.refs or node.host_refs or (snap and snap.pages)), (
            "only an unreferenced leaf whose state was freed is unlinked"
        )
        if self.tell is not None:
            self.tell.removed(node)
        del parent.children[node.key]
        evictable = self.evictable
        evictable.discard(node)
        self.node_count -= 1
        self.page_count -= len(node.pages)
        node.parent = None
        # _refresh(parent), inline: the LRU eviction unlinks every victim through here
        if parent.children or parent.refs or parent.host_refs:
            evictable.discard(parent)
        elif parent.parent is not None or Fault.ROOT_IN_EVICT_SET in self.faults:
            evictable.add(parent)
        else:
            evictable.discard(parent)

    # -- refs -------------------------------------------------------------------
    def inc(self, node: Node) -> None:
        node.refs += 1
        self.evictable.discard(node)  # a referenced node is never evictable
        if self.tell is not None:
            self.tell.refs((node,), 1)

    def dec(self, node: Node) -> None:
        self._dec(node)
        if self.tell is not None:
            self.tell.refs((node,), -1)

    def _inc(self, node: Node) -> None:
        node.refs += 1
        self.evictable.discard(node)  # a referenced node is never evictable

    def _dec(self, node: Node) -> None:
        if node.refs <= 0:
            raise CacheInvariantError(f"ref count of {node} would drop below zero")
        node.refs -= 1
        self._refresh(node)

    def lock(self, node: Node) -> None:
        for n in node.path():
            self._inc(n)
        if self.tell is not None:  # the path is walked again only for a listener
            self.tell.refs(node.path(), 1)

    def lock_used(self, path: list[Node]) -> None:
        """``lock`` then ``touch`` the last node of ``path`` (root-down, root
        excluded, as a walk lists it), in one pass."""
        now, evictable = self.tick(), self.evictable
        for node in (self.root, *path):
            node.refs += 1
            node.last_access = now
            evictable.discard(node)  # a referenced node is never evictable
        if self.tell is not None:
            self.tell.refs(itertools.chain((self.root,), path), 1)

    def unlock(self, node: Node) -> None:
        for n in node.path():
            self._dec(n)
        if self.tell is not None:
            self.tell.refs(node.path(), -1)

    def add_host_ref(self, node: Node) -> None:
        node.host_refs += 1
        self._refresh(node)

    def drop_host_ref(self, node: Node) -> None:
        if node.host_refs <= 0:
            raise CacheInvariantError(f"host ref count of {node} would drop below zero")
        node.host_refs -= 1
        self._refresh(node)

    def _refresh(self, node: Node) -> None:
        """``node`` is in the evict set exactly when it is an unreferenced non-root leaf."""
        if node.children or node.refs or node.host_refs:
            self.evictable.discard(node)
        elif node.parent is not None or Fault.ROOT_IN_EVICT_SET in self.faults:
            self.evictable.add(node)
        else:
            self.evictable.discard(node)

    # -- snapshots --------------------------------------------------------------
    def attach_state(self, node: Node, group: str, pages: np.ndarray, tier: Tier) -> None:
        """Give ``node`` the state pages of one group (pages already tagged TREE_OWNER)."""
        assert not node.is_root, "the root carries no state"
        snap = node.snapshot
        if snap is None:
            snap = node.snapshot = Snapshot({}, tier)
        assert group not in snap.pages and (not snap.pages or snap.tier == tier)
        snap.tier = tier
        snap.pages[group] = pages
        self.snapshot_nodes.add(node)
        self.state_pages[group, tier] += len(pages)

    def detach_state(self, node: Node) -> Snapshot:
        """Take every state page off ``node``; the empty record stays (history-only)."""
        snap = node.snapshot
        assert snap is not None
        taken = Snapshot(snap.pages, snap.tier)
        counts = self.state_pages
        for group, pages in taken.pages.items():
            counts[group, taken.tier] -= len(pages)
        snap.pages = {}
        self.snapshot_nodes.discard(node)
        return taken

    # -- eviction ---------------------------------------------------------------
    def evict(self, wanted: int, release: Callable[[Node], int]) -> int:
        """Evict least-recently-used evictable leaves until ``wanted`` is reached.

        ``release(node)`` frees the victim's pages and returns how many of them
        count towards ``wanted``. A parent that becomes an unlocked leaf joins
        the candidates, so a whole cold branch can go in one call.
        """
        if wanted > self.page_count + sum(self.state_pages.values()):
            return self.evict_all(release)
        evictable, pop, push = self.evictable, heapq.heappop, heapq.heappush
        heap = [(n.last_access, n.id, n) for n in evictable]
        heapq.heapify(heap)
        got = 0
        while got < wanted and heap:
            node = pop(heap)[2]
            parent = node.parent
            if parent is None or node not in evictable:
                # The root holds no pages and is never taken. It can only sit in
                # the set through the root-in-evict-set fault, which stays latent
                # here, as in its seed report; the audit is what sees it.
                continue
            got += release(node)
            self._unlink(node, parent)
            if parent in evictable:
                push(heap, (parent.last_access, parent.id, parent))
        return got

    def evict_all(self, release: Callable[[Node], int]) -> int:
        """Every evictable leaf goes, and every parent that becomes one (``evict``
        of more than the tree holds), so the order does not matter (no heap).

        ``_unlink`` inline, one victim at a time, children before their parent.
        A parent left an unreferenced non-root leaf goes straight onto the work
        list and never joins ``evictable``: it leaves in this same call, so the
        set ends as ``_refresh`` would leave it (empty, or the root under its
        fault). Each node enters the work list once: the leaves the set held,
        then each parent when its last child left.
        """
        evictable = self.evictable
        work, got, nodes, pages = list(evictable), 0, 0, 0
        root_fault = Fault.ROOT_IN_EVICT_SET in self.faults
        # the evict-parent-unannounced fault tells only of the leaves the call began with
        tell, told = self.tell, set(work) if Fault.EVICT_PARENT_UNANNOUNCED in self.faults else None
        try:
            while work:
                node = work.pop()
                parent = node.parent
                if parent is None:
                    continue  # the root (fault only): it stays in the set
                got += release(node)
                snap = node.snapshot
                assert not (
                    node.children or node.refs or node.host_refs or (snap and snap.pages)
                ), "only an unreferenced leaf whose state was freed is unlinked"
                if tell is not None and (told is None or node in told):
                    tell.removed(node)
                del parent.children[node.key]
                evictable.discard(node)
                node.parent = None
                nodes += 1
                pages += len(node.pages)
                if parent.children or parent.refs or parent.host_refs:
                    continue
                if parent.parent is not None:
                    work.append(parent)
                elif root_fault:
                    evictable.add(parent)
        finally:  # counted once; a failed release leaves the parents queued so far in the set
            self.node_count -= nodes
            self.page_count -= pages
            evictable.update(n for n in work if n.parent is not None and n not in evictable)
        return got

    def nodes(self) -> list[Node]:
        """Every node, root first, parents before children."""
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out


def _agreeing(mine: list[int], at: int, tokens: list[int], pos: int, end: int) -> int:
    """Length of the common run of ``mine[at:]`` and ``tokens[pos:end]``."""
    n = min(len(mine) - at, end - pos)
    k = 0
    while k < n and mine[at + k] == tokens[pos + k]:
        k += 1
    return k
