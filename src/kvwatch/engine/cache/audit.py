"""The audit: a pure check of the cache against what its live holders imply.

Nothing here mutates the cache: it reads a ``CacheView`` (view.py). It
recomputes, from the holders and the tree alone, who should hold each page and what every ref count should be, and
reports each disagreement as a ``Finding``:

* pools (vectorised over every page): orphans, double ownership (including an
  owner tag that disagrees with the holder), pages both free and owned;
* slots (``slots`` mode): each slot claims its snapshot's pages, and the
  slot table reports entries that disagree with the slots they point at;
* refs: the root's and every node's device and host refs against the locks and
  host refs of live holders;
* tree: the evict set against the unlocked non-root leaves, the counters
  against recomputed sums, node shapes and links, host-ref'd nodes that lost
  their state, and holders whose borrowed pages differ from their locked path.

Cost: one Python pass over the nodes and holders, then a few numpy ops per
pool, so a million-page pool audits in tens of milliseconds.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from kvwatch.contracts import Finding, FindingKind, RootRefs, finding
from kvwatch.engine.cache.claims import Claims, owner_key, owner_name
from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.pool import PagePool
from kvwatch.engine.cache.radix import TREE_OWNER
from kvwatch.engine.cache.view import CacheView, TreeReads
from kvwatch.engine.config import FULL_KV, STATE_GROUPS, SWA_KV


class AuditReport(NamedTuple):
    findings: tuple[Finding, ...]
    root_refs: RootRefs

    @property
    def clean(self) -> bool:
        return not self.findings


def audit(view: CacheView) -> AuditReport:
    """Every disagreement between the cache and what its live holders imply.

    Claimants register in a fixed order (the tree's nodes, the holders, the
    backend's stored pages), which is the order a finding names them in.
    """
    claims = Claims()
    refs = _holder_refs(view)
    scan = _scan_tree(view, claims, refs)
    claim_holders(view, claims)
    view.stored.claim(claims)
    owners = claims.owner_keys()
    findings: list[Finding] = []
    for group, pool in view.pools.items():
        findings += _audit_pool(pool, group, Tier.DEVICE, claims, owners, view.holders)
    for group, pool in view.host_pools.items():
        findings += _audit_pool(pool, group, Tier.HOST, claims, owners, view.holders)
    findings += scan.ref_findings
    findings += [
        finding(FindingKind.TREE, None, [], p) for p in scan.problems + _holder_problems(view)
    ]
    findings += view.stored.findings()
    return AuditReport(tuple(findings), RootRefs(view.tree.root.refs, refs.device[0]))


def claim_holders(view: CacheView, claims: Claims) -> None:
    """Register every live holder with the pages it owns: its own ``full.kv``
    pages past the borrowed prefix, its window, its working state, its pending
    snapshots (read off the holder record, not through the code that fills it)."""
    p = view.page_size
    for h in view.holders.values():
        me = claims.register(h.owner, h)
        claims.add(FULL_KV, Tier.DEVICE, h.own_full_pages(p), me)
        claims.add(SWA_KV, Tier.DEVICE, list(h.swa_pages.values()), me)
        for group, ids in h.working.items():
            claims.add(group, Tier.DEVICE, ids, me)
        for pend in h.pending.values():
            for group, ids in pend.pages.items():
                claims.add(group, Tier.DEVICE, ids, me)


class _HolderRefs(NamedTuple):
    """Ref counts the live holders imply, by node id, and the nodes they name."""

    device: Counter[int]  # holders whose lock path covers the node
    host: Counter[int]  # retracted holders that recover from exactly the node
    nodes: dict[int, Node]  # every node with an implied ref, root included


class _TreeScan(NamedTuple):
    problems: list[str]
    ref_findings: list[Finding]


def _holder_refs(view: CacheView) -> _HolderRefs:
    device: Counter[int] = Counter()
    host: Counter[int] = Counter()
    nodes: dict[int, Node] = {}
    for holder in view.holders.values():
        if holder.lock_node is not None:
            for n in holder.lock_node.path():
                device[n.id] += 1
                nodes[n.id] = n
        if holder.anchor is not None:
            host[holder.anchor.id] += 1
            nodes[holder.anchor.id] = holder.anchor
    return _HolderRefs(device, host, nodes)


def _scan_tree(view: CacheView, claims: Claims, refs: _HolderRefs) -> _TreeScan:
    """One walk over the tree: claim each node's pages; check each link, each
    node's shape and snapshot, and the tree's counters; then the refs.

    A link is sound when the parent lists the child under the child's own key
    and the child points back at that parent, and depths add up::

        parent.children[key] is n  ─►  n.key == key, n.parent is parent,
                                       n.depth == parent.depth + len(n.tokens)

    The walk follows ``children`` from the root, so a node whose parent link
    is broken is still reached (and reported) as long as a parent lists it.
    Refs are compared where they can differ from zero: at nodes that hold refs,
    and at the few nodes on live holders' paths.
    """
    tree = view.tree
    per_snapshot = {g: view.config.pages_per_snapshot(g) for g in STATE_GROUPS}
    walked = _walk(tree.root, view.page_size, per_snapshot, first=len(claims.who))
    state = _claim_walked(claims, walked)
    out = walked.problems
    for n in walked.with_refs:
        if n.host_refs and not n.has_complete_snapshot:
            out.append(
                f"node {n.id} (depth {n.depth}): {n.host_refs} retracted holder(s) recover "
                "from it, but its state is gone"
            )
    out += _counter_problems(tree, walked, state)
    return _TreeScan(out, _ref_findings(tree.root, walked.with_refs, refs))


class _Walked(NamedTuple):
    """What one walk over the tree saw (``body`` in walk order, root excluded)."""

    body: list[Node]
    first: int  # the claimant index of body[0]
    page_arrays: list[np.ndarray]  # each node's full.kv pages, in body order
    pages: int
    # (group, tier) -> snapshot page arrays, their claimant indices, their sizes
    state_pages: dict[tuple[str, Tier], tuple[list[np.ndarray], list[int], list[int]]]
    with_refs: list[Node]
    want_evict: set[Node]  # unlocked leaves: exactly the evict set
    with_state: set[Node]
    problems: list[str]


def _walk(root: Node, p: int, per_snapshot: dict[str, int], *, first: int) -> _Walked:
    w = _Walked(
        body=[],
        first=first,
        page_arrays=[],
        pages=0,
        state_pages={},
        with_refs=[],
        want_evict=set(),
        with_state=set(),
        problems=[],
    )
    out, pages, stack = w.problems, 0, [root]
    while stack:
        parent = stack.pop()
        for key, n in parent.children.items():
            index = first + len(w.body)
            w.body.append(n)
            n_tokens, n_pages = len(n.tokens), n.pages.size
            w.page_arrays.append(n.pages)
            pages += n_pages
            if n.children:
                stack.append(n)
            if n.refs or n.host_refs:
                w.with_refs.append(n)
            elif not n.children:
                w.want_evict.add(n)
            if not n_tokens or n_tokens != n_pages * p:
                out.append(f"node {n.id}: {n_tokens} tokens over {n_pages} pages")
            if n.parent is not parent or n.key != key or n.depth != parent.depth + n_tokens:
                out.append(f"node {n.id}: depth or parent link broken")
            if parent is not root and parent.extra_key != n.extra_key:
                out.append(f"node {n.id}: extra key differs from its parent's")
            if n.snapshot is not None and n.snapshot.pages:
                _walk_snapshot(n, index, w, per_snapshot)
    return w._replace(pages=pages)


def _walk_snapshot(n: Node, index: int, w: _Walked, per_snapshot: dict[str, int]) -> None:
    snap = n.snapshot
    w.with_state.add(n)
    for group, held_ids in snap.pages.items():
        held, claimant, sizes = w.state_pages.setdefault((group, snap.tier), ([], [], []))
        held.append(held_ids)
        claimant.append(index)
        sizes.append(held_ids.size)
        if held_ids.size != per_snapshot[group]:
            w.problems.append(f"node {n.id}: {group} snapshot has {held_ids.size} pages")
    if not snap.complete:
        w.problems.append(f"node {n.id}: snapshot holds only {sorted(snap.pages)}")


def _claim_walked(claims: Claims, w: _Walked) -> Counter[tuple[str, Tier]]:
    """Register every node as the tree's claimant; returns state pages per (group, tier)."""
    claims.owners.extend(itertools.repeat(TREE_OWNER, len(w.body)))
    claims.who.extend(w.body)
    lengths = [a.size for a in w.page_arrays]
    claims.add_many(
        FULL_KV, Tier.DEVICE, w.page_arrays, range(w.first, w.first + len(w.body)), lengths
    )
    state: Counter[tuple[str, Tier]] = Counter()
    for (group, tier), (held, claimant, sizes) in w.state_pages.items():
        claims.add_many(group, tier, held, claimant, sizes)
        state[group, tier] = sum(sizes)
    return state


def _counter_problems(tree: TreeReads, w: _Walked, state: Counter) -> list[str]:
    """The tree's own counters and sets against what the walk counted."""
    out = []
    for n in tree.evictable - w.want_evict:
        what = "root" if n.is_root else f"node {n.id}"
        out.append(f"{what} is in the evict set but is not an unlocked non-root leaf")
    for n in w.want_evict - tree.evictable:
        out.append(f"node {n.id} is an unlocked leaf missing from the evict set")
    if tree.node_count != len(w.body):
        out.append(f"node counter {tree.node_count} != {len(w.body)} nodes")
    if tree.page_count != w.pages:
        out.append(f"page counter {tree.page_count} != {w.pages} pages held by nodes")
    if +tree.state_pages != +state:
        out.append(f"state page counters {dict(+tree.state_pages)} != held {dict(state)}")
    if tree.snapshot_nodes != w.with_state:
        out.append(
            f"snapshot set has {len(tree.snapshot_nodes)} nodes, {len(w.with_state)} carry state"
        )
    return out


def _ref_findings(root: Node, with_refs: list[Node], refs: _HolderRefs) -> list[Finding]:
    """Nodes whose refs differ from what the live holders imply.

    Only nodes that hold refs (``with_refs``, from the walk) or that live
    holders name can differ; the rest hold zero and are implied zero. A named
    node outside the tree is the holder's problem, not a ref count's.
    """
    want_device, want_host = refs.device.get, refs.host.get  # not Counter.__missing__
    named = [n for n in refs.nodes.values() if list(n.path())[-1] is root]
    out, seen = [], set()
    for n in [root, *with_refs, *named]:
        if n.id in seen:
            continue
        seen.add(n.id)
        if n.refs != want_device(n.id, 0) or n.host_refs != want_host(n.id, 0):
            out.append(_ref_finding(n, refs))
    return out


def _ref_finding(node: Node, refs: _HolderRefs) -> Finding:
    what = "root" if node.is_root else f"node {node.id} (depth {node.depth})"
    return finding(
        FindingKind.REF_MISMATCH,
        None,
        [],
        f"{what}: refs {node.refs}/host {node.host_refs}, "
        f"live holders imply {refs.device[node.id]}/{refs.host[node.id]}",
    )


def _audit_pool(
    pool: PagePool,
    group: str,
    tier: Tier,
    claims: Claims,
    owners: np.ndarray,
    holders: Mapping[int, Holder],
) -> list[Finding]:
    """Every page of one pool against the free stack, its tag and its claimants."""
    view = _PoolAudit(pool, group, tier, claims, holders)
    return view.stack_findings() + view.claim_findings() + view.tag_findings(owners)


class _PoolAudit:
    """One pool's pages counted three ways: on the free stack, claimed, tagged.

    ::

        page     on_stack  held  tagged   verdict
        free     1         0     no       fine
        held     0         1     yes      fine (if the tag is the claimant's)
        ...      >1        -     -        double free
        ...      1         >0    or yes   free and owned
        ...      0         >1    -        held twice
        ...      0         0     -        orphan
    """

    def __init__(
        self,
        pool: PagePool,
        group: str,
        tier: Tier,
        claims: Claims,
        holders: Mapping[int, Holder],
    ) -> None:
        self.group, self.claims, self.holders = group, claims, holders
        self.label = group if tier is Tier.DEVICE else f"{group} (host)"
        self.snap = snap = pool.view()
        self.claimed = claims.arrays(group, tier)
        self.held = np.bincount(self.claimed.pages, minlength=pool.capacity)
        self.on_stack = np.bincount(snap.free_pages, minlength=pool.capacity)
        self.tagged = snap.owner_kind != int(OwnerKind.FREE)

    def tag(self, page: int) -> str:
        kind = OwnerKind(int(self.snap.owner_kind[page]))
        if kind is OwnerKind.FREE:
            return "free"
        owner = Owner(kind, int(self.snap.owner_id[page]))
        return owner_name(owner, self.holders.get(owner.id))

    def holders_of(self, page: int) -> str:
        who = self.claimed.who()[self.claimed.pages == page]
        return ", ".join(self.claims.describe(int(i)) for i in who)

    def _finding(self, kind: FindingKind, pages: list[int], what: str) -> Finding:
        return finding(kind, self.group, pages, f"{self.label}: {len(pages)} {what}")

    def stack_findings(self) -> list[Finding]:
        out = []
        twice_free = np.flatnonzero(self.on_stack > 1).tolist()
        if twice_free:
            what = "pages on the free stack twice (double free)"
            out.append(self._finding(FindingKind.DOUBLE_OWNED, twice_free, what))
        free = (self.on_stack > 0) & ((self.held > 0) | self.tagged)
        if free_owned := np.flatnonzero(free).tolist():
            p = free_owned[0]
            what = f"free pages still tagged or held; page {p} tagged {self.tag(p)}, held by [{self.holders_of(p)}]"
            out.append(self._finding(FindingKind.FREE_AND_OWNED, free_owned, what))
        return out

    def claim_findings(self) -> list[Finding]:
        out = []
        if doubles := np.flatnonzero(self.held > 1).tolist():
            p = doubles[0]
            what = f"pages held twice; page {p} held by [{self.holders_of(p)}]"
            out.append(self._finding(FindingKind.DOUBLE_OWNED, doubles, what))
        if orphans := np.flatnonzero((self.held == 0) & (self.on_stack == 0)).tolist():
            last = Counter(self.tag(p) for p in orphans[:256])
            what = (
                f"allocated pages held by no live holder; last owners {dict(last.most_common(4))}"
            )
            out.append(self._finding(FindingKind.ORPHAN, orphans, what))
        return out

    def tag_findings(self, owners: np.ndarray) -> list[Finding]:
        """Tags against claimants, one int64 compare per claimed page; a page
        held twice is reported by ``claim_findings``, not again here."""
        pages, claimed = self.claimed.pages, self.claimed
        if not pages.size:
            return []
        tags = owner_key(self.snap.owner_kind, self.snap.owner_id)
        expected = np.repeat(owners[claimed.claimants], claimed.lengths)
        bad_at = pages[tags[pages] != expected]
        bad = bad_at[self.held[bad_at] == 1].tolist()
        if not bad:
            return []
        p = bad[0]
        what = f"pages tagged for another owner; page {p} tagged {self.tag(p)}, held by [{self.holders_of(p)}]"
        return [self._finding(FindingKind.DOUBLE_OWNED, bad, what)]


def _holder_problems(view: CacheView) -> list[str]:
    p = view.page_size
    root = view.tree.root
    out = []
    for h in view.holders.values():
        problems = []
        if not h.cached_len <= h.computed_len <= h.allocated_len:
            problems.append(
                f"lengths cached {h.cached_len} computed {h.computed_len} allocated {h.allocated_len}"
            )
        if h.full_pages and len(h.full_pages) != math.ceil(h.allocated_len / p):
            problems.append(f"{len(h.full_pages)} full.kv pages for {h.allocated_len} tokens")
        if h.lock_node is not None:
            if h.lock_node.depth != h.cached_len:
                problems.append(f"lock at depth {h.lock_node.depth}, cached_len {h.cached_len}")
            path = list(h.lock_node.path())
            if path[-1] is not root:
                problems.append("locked node is no longer in the tree")
            borrowed = np.concatenate([n.pages for n in reversed(path)])
            if not np.array_equal(borrowed, h.full_pages[: h.cached_len // p]):
                problems.append("borrowed pages differ from the locked path's pages")
        elif h.cached_len:
            problems.append(f"cached_len {h.cached_len} without a lock")
        if h.anchor is not None and list(h.anchor.path())[-1] is not root:
            problems.append("host-ref'd node is no longer in the tree")
        out += [f"{h.owner}: {what}" for what in problems]
    return out
