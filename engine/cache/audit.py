"""The audit: a pure check of the cache against what its live holders imply.

Nothing here mutates the cache. It recomputes, from the holders and the tree
alone, who should hold each page and what every ref count should be, and
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
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from kvwatch.contracts import Finding, FindingKind, RootRefs, finding
from kvwatch.engine.cache.claims import (
    Claims,
    claim_holders,
    claim_slots,
    owner_key,
    owner_name,
)
from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.pool import PagePool
from kvwatch.engine.cache.radix import TREE_OWNER
from kvwatch.engine.config import FULL_KV, STATE_GROUPS

if TYPE_CHECKING:
    from kvwatch.engine.cache.hybrid import HybridPrefixCache


class AuditReport(NamedTuple):
    findings: tuple[Finding, ...]
    root_refs: RootRefs

    @property
    def clean(self) -> bool:
        return not self.findings


def audit(cache: HybridPrefixCache) -> AuditReport:
    claims = Claims()
    refs = _holder_refs(cache)
    scan = _scan_tree(cache, claims, refs)
    claim_holders(cache, claims)
    claim_slots(cache, claims)
    owners = claims.owner_keys()
    findings: list[Finding] = []
    for group, pool in cache.pools.items():
        findings += _audit_pool(pool, group, Tier.DEVICE, claims, owners, cache.holders)
    for group, pool in cache.host_pools.items():
        findings += _audit_pool(pool, group, Tier.HOST, claims, owners, cache.holders)
    findings += scan.ref_findings
    findings += [
        finding(FindingKind.TREE, None, [], p) for p in scan.problems + _holder_problems(cache)
    ]
    if cache.slots is not None:
        findings += cache.slots.findings()
    return AuditReport(tuple(findings), RootRefs(cache.tree.root.refs, refs.device[0]))


class _HolderRefs(NamedTuple):
    """Ref counts the live holders imply, by node id, and the nodes they name."""

    device: Counter[int]  # holders whose lock path covers the node
    host: Counter[int]  # retracted holders that recover from exactly the node
    nodes: dict[int, Node]  # every node with an implied ref, root included


class _TreeScan(NamedTuple):
    problems: list[str]
    ref_findings: list[Finding]


def _holder_refs(cache: HybridPrefixCache) -> _HolderRefs:
    device: Counter[int] = Counter()
    host: Counter[int] = Counter()
    nodes: dict[int, Node] = {}
    for holder in cache.holders.values():
        if holder.lock_node is not None:
            for n in holder.lock_node.path():
                device[n.id] += 1
                nodes[n.id] = n
        if holder.anchor is not None:
            host[holder.anchor.id] += 1
            nodes[holder.anchor.id] = holder.anchor
    return _HolderRefs(device, host, nodes)


def _scan_tree(cache: HybridPrefixCache, claims: Claims, refs: _HolderRefs) -> _TreeScan:
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
    tree, p = cache.tree, cache.page_size
    root = tree.root
    out: list[str] = []
    per_snapshot = {g: cache.config.pages_per_snapshot(g) for g in STATE_GROUPS}
    want_evict, with_state = set(), set()
    state_pages: dict[tuple[str, Tier], tuple[list[np.ndarray], list[int], list[int]]] = {}
    body: list[Node] = []
    with_refs: list[Node] = []
    page_arrays: list[np.ndarray] = []
    page_lengths: list[int] = []
    first = len(claims.who)
    pages = 0
    stack = [root]
    while stack:
        parent = stack.pop()
        for key, n in parent.children.items():
            index = first + len(body)
            body.append(n)
            tokens, ids, kids = n.tokens, n.pages, n.children
            n_tokens = len(tokens)
            page_arrays.append(ids)
            n_pages = ids.size
            page_lengths.append(n_pages)
            pages += n_pages
            if kids:
                stack.append(n)
            if n.refs or n.host_refs:
                with_refs.append(n)
            elif not kids:
                want_evict.add(n)
            if not n_tokens or n_tokens != n_pages * p:
                out.append(f"node {n.id}: {n_tokens} tokens over {n_pages} pages")
            if n.parent is not parent or n.key != key or n.depth != parent.depth + n_tokens:
                out.append(f"node {n.id}: depth or parent link broken")
            if parent is not root and parent.extra_key != n.extra_key:
                out.append(f"node {n.id}: extra key differs from its parent's")
            snap = n.snapshot
            if snap is not None and snap.pages:
                with_state.add(n)
                for group, held_ids in snap.pages.items():
                    held, claimant, sizes = state_pages.setdefault((group, snap.tier), ([], [], []))
                    held.append(held_ids)
                    claimant.append(index)
                    sizes.append(held_ids.size)
                    if held_ids.size != per_snapshot[group]:
                        out.append(f"node {n.id}: {group} snapshot has {held_ids.size} pages")
                if not snap.complete:
                    out.append(f"node {n.id}: snapshot holds only {sorted(snap.pages)}")
    claims.owners.extend(itertools.repeat(TREE_OWNER, len(body)))
    claims.who.extend(body)
    claims.add_many(
        FULL_KV, Tier.DEVICE, page_arrays, range(first, first + len(body)), page_lengths
    )
    state: Counter[tuple[str, Tier]] = Counter()
    for (group, tier), (held, claimant, sizes) in state_pages.items():
        claims.add_many(group, tier, held, claimant, sizes)
        state[group, tier] = sum(sizes)
    for n in with_refs:
        if n.host_refs and not n.has_complete_snapshot:
            out.append(
                f"node {n.id} (depth {n.depth}): {n.host_refs} retracted holder(s) recover "
                "from it, but its state is gone"
            )
    for n in tree.evictable - want_evict:
        what = "root" if n.is_root else f"node {n.id}"
        out.append(f"{what} is in the evict set but is not an unlocked non-root leaf")
    for n in want_evict - tree.evictable:
        out.append(f"node {n.id} is an unlocked leaf missing from the evict set")
    if tree.node_count != len(body):
        out.append(f"node counter {tree.node_count} != {len(body)} nodes")
    if tree.page_count != pages:
        out.append(f"page counter {tree.page_count} != {pages} pages held by nodes")
    if +tree.state_pages != +state:
        out.append(f"state page counters {dict(+tree.state_pages)} != held {dict(state)}")
    if tree.snapshot_nodes != with_state:
        out.append(
            f"snapshot set has {len(tree.snapshot_nodes)} nodes, {len(with_state)} carry state"
        )
    return _TreeScan(out, _ref_findings(root, with_refs, refs))


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
    out: list[Finding] = []
    label = group if tier is Tier.DEVICE else f"{group} (host)"
    snap = pool.view()
    claimed = claims.arrays(group, tier)
    pages = claimed.pages
    held = np.bincount(pages, minlength=pool.capacity)
    on_stack = np.bincount(snap.free_pages, minlength=pool.capacity)
    tagged = snap.owner_kind != int(OwnerKind.FREE)

    def tag(page: int) -> str:
        kind = OwnerKind(int(snap.owner_kind[page]))
        if kind is OwnerKind.FREE:
            return "free"
        owner = Owner(kind, int(snap.owner_id[page]))
        return owner_name(owner, holders.get(owner.id))

    def holders_of(page: int) -> str:
        return ", ".join(claims.describe(int(i)) for i in claimed.who()[pages == page])

    twice_free = np.flatnonzero(on_stack > 1).tolist()
    if twice_free:
        out.append(
            finding(
                FindingKind.DOUBLE_OWNED,
                group,
                twice_free,
                f"{label}: {len(twice_free)} pages on the free stack twice (double free)",
            )
        )
    free_owned = np.flatnonzero((on_stack > 0) & ((held > 0) | tagged)).tolist()
    if free_owned:
        p = free_owned[0]
        out.append(
            finding(
                FindingKind.FREE_AND_OWNED,
                group,
                free_owned,
                f"{label}: {len(free_owned)} free pages still tagged or held; page {p} tagged {tag(p)}, held by [{holders_of(p)}]",
            )
        )
    doubles = np.flatnonzero(held > 1).tolist()
    if doubles:
        p = doubles[0]
        out.append(
            finding(
                FindingKind.DOUBLE_OWNED,
                group,
                doubles,
                f"{label}: {len(doubles)} pages held twice; page {p} held by [{holders_of(p)}]",
            )
        )
    orphans = np.flatnonzero((held == 0) & (on_stack == 0)).tolist()
    if orphans:
        last = Counter(tag(p) for p in orphans[:256])
        out.append(
            finding(
                FindingKind.ORPHAN,
                group,
                orphans,
                f"{label}: {len(orphans)} allocated pages held by no live holder; last owners {dict(last.most_common(4))}",
            )
        )
    if pages.size:
        # Tags against claimants, one int64 compare per claimed page; a page
        # held twice is reported above, not again here.
        tags = owner_key(snap.owner_kind, snap.owner_id)
        expected = np.repeat(owners[claimed.claimants], claimed.lengths)
        bad_at = pages[tags[pages] != expected]
        bad = bad_at[held[bad_at] == 1].tolist()
        if bad:
            p = bad[0]
            out.append(
                finding(
                    FindingKind.DOUBLE_OWNED,
                    group,
                    bad,
                    f"{label}: {len(bad)} pages tagged for another owner; page {p} tagged {tag(p)}, held by [{holders_of(p)}]",
                )
            )
    return out


def _holder_problems(cache: HybridPrefixCache) -> list[str]:
    p = cache.page_size
    out = []
    for h in cache.holders.values():
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
            if path[-1] is not cache.tree.root:
                problems.append("locked node is no longer in the tree")
            borrowed = np.concatenate([n.pages for n in reversed(path)])
            if not np.array_equal(borrowed, h.full_pages[: h.cached_len // p]):
                problems.append("borrowed pages differ from the locked path's pages")
        elif h.cached_len:
            problems.append(f"cached_len {h.cached_len} without a lock")
        if h.anchor is not None and list(h.anchor.path())[-1] is not cache.tree.root:
            problems.append("host-ref'd node is no longer in the tree")
        out += [f"{h.owner}: {what}" for what in problems]
    return out
