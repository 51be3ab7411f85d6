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
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from kvwatch.engine.cache.findings import (
    DOUBLE_OWNED,
    FREE_AND_OWNED,
    ORPHAN,
    REF_MISMATCH,
    TREE,
    Finding,
    finding,
)
from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.pool import PagePool
from kvwatch.engine.cache.radix import TREE_OWNER
from kvwatch.engine.cache.slots import Slot
from kvwatch.engine.config import FULL_KV, STATE_GROUPS, SWA_KV

if TYPE_CHECKING:
    from kvwatch.engine.cache.hybrid import HybridPrefixCache

EMPTY = np.empty(0, dtype=np.int64)


class RootRefs(NamedTuple):
    actual: int
    expected: int


class AuditReport(NamedTuple):
    findings: tuple[Finding, ...]
    root_refs: RootRefs

    @property
    def clean(self) -> bool:
        return not self.findings


class _Claims:
    """Who holds which pages, per (group, tier), as parallel numpy arrays.

    Every claimant (a node or a holder) gets an index into ``who``; each
    (group, tier) keeps its page-id arrays and the claimant index of each.
    """

    def __init__(self) -> None:
        self.pages: dict[tuple[str, Tier], list[np.ndarray]] = {}
        self.claimant: dict[tuple[str, Tier], list[int]] = {}
        # parallel lists, not (owner, who) tuples: a million-page tree has tens of
        # thousands of claimants, and that many tuples would wake the collector
        self.owners: list[Owner] = []
        self.who: list[Node | Holder | Slot] = []

    def register(self, owner: Owner, who: Node | Holder | Slot) -> int:
        self.owners.append(owner)
        self.who.append(who)
        return len(self.who) - 1

    def add(self, group: str, tier: Tier, pages, claimant: int) -> None:
        ids = np.asarray(pages, dtype=np.int64)
        if ids.size:
            self.pages.setdefault((group, tier), []).append(ids)
            self.claimant.setdefault((group, tier), []).append(claimant)

    def add_many(
        self, group: str, tier: Tier, pages: list[np.ndarray], claimants: list[int]
    ) -> None:
        self.pages.setdefault((group, tier), []).extend(pages)
        self.claimant.setdefault((group, tier), []).extend(claimants)

    def arrays(self, group: str, tier: Tier) -> tuple[np.ndarray, np.ndarray]:
        """Claimed page ids, and the claimant index of each."""
        parts = self.pages.get((group, tier))
        if not parts:
            return EMPTY, EMPTY
        lengths = np.fromiter((p.size for p in parts), dtype=np.int64, count=len(parts))
        return np.concatenate(parts), np.repeat(self.claimant[group, tier], lengths)

    def owner_keys(self) -> np.ndarray:
        """``owner_key`` of every claimant, by claimant index."""
        n = len(self.owners)
        kinds = np.fromiter((int(o.kind) for o in self.owners), dtype=np.int64, count=n)
        ids = np.fromiter((o.id for o in self.owners), dtype=np.int64, count=n)
        return owner_key(kinds, ids)

    def describe(self, index: int) -> str:
        owner, who = self.owners[index], self.who[index]
        return f"node {who.id} (depth {who.depth})" if isinstance(who, Node) else str(owner)


def owner_key(kinds: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """One int64 per (owner kind, owner id): ids stay below 2**48."""
    return (kinds.astype(np.int64) << 48) | ids


def audit(cache: HybridPrefixCache) -> AuditReport:
    nodes = cache.tree.nodes()
    claims = _Claims()
    problems = _scan_tree(cache, nodes, claims)
    _claim_holders(cache, claims)
    _claim_slots(cache, claims)
    owners = claims.owner_keys()
    findings: list[Finding] = []
    for group, pool in cache.pools.items():
        findings += _audit_pool(pool, group, Tier.DEVICE, claims, owners)
    for group, pool in cache.host_pools.items():
        findings += _audit_pool(pool, group, Tier.HOST, claims, owners)
    ref_findings, root = _audit_refs(cache, nodes)
    findings += ref_findings
    findings += [finding(TREE, None, [], p) for p in problems + _holder_problems(cache)]
    if cache.slots is not None:
        findings += cache.slots.findings()
    return AuditReport(tuple(findings), root)


def _scan_tree(cache: HybridPrefixCache, nodes: list[Node], claims: _Claims) -> list[str]:
    """One pass over the nodes: claim their pages and check shape, links and counters."""
    tree, p = cache.tree, cache.page_size
    body = nodes[1:]
    first = len(claims.who)
    claims.owners.extend(itertools.repeat(TREE_OWNER, len(body)))
    claims.who.extend(body)
    claims.add_many(
        FULL_KV, Tier.DEVICE, [n.pages for n in body], list(range(first, first + len(body)))
    )
    out: list[str] = []
    per_snapshot = {g: cache.config.pages_per_snapshot(g) for g in STATE_GROUPS}
    want_evict, with_state = set(), set()
    state_pages: dict[tuple[str, Tier], tuple[list[np.ndarray], list[int]]] = {}
    pages = 0
    for index, n in enumerate(body, first):
        parent, tokens = n.parent, n.tokens
        n_pages = n.pages.size
        pages += n_pages
        if not tokens or len(tokens) != n_pages * p:
            out.append(f"node {n.id}: {len(tokens)} tokens over {n_pages} pages")
        if (
            n.depth != parent.depth + len(tokens)
            or parent.children.get((n.extra_key, *tokens[:p])) is not n
        ):
            out.append(f"node {n.id}: depth or parent link broken")
        if parent.parent is not None and parent.extra_key != n.extra_key:
            out.append(f"node {n.id}: extra key differs from its parent's")
        if not n.children and not n.refs and not n.host_refs:
            want_evict.add(n)
        snap = n.snapshot
        if snap is not None and snap.pages:
            with_state.add(n)
            for group, ids in snap.pages.items():
                held, claimant = state_pages.setdefault((group, snap.tier), ([], []))
                held.append(ids)
                claimant.append(index)
                if ids.size != per_snapshot[group]:
                    out.append(f"node {n.id}: {group} snapshot has {ids.size} pages")
            if not snap.complete:
                out.append(f"node {n.id}: snapshot holds only {sorted(snap.pages)}")
        if n.host_refs and not n.has_complete_snapshot:
            out.append(
                f"node {n.id} (depth {n.depth}): {n.host_refs} retracted holder(s) recover "
                "from it, but its state is gone"
            )
    state: Counter[tuple[str, Tier]] = Counter()
    for (group, tier), (held, claimant) in state_pages.items():
        claims.add_many(group, tier, held, claimant)
        state[group, tier] = sum(ids.size for ids in held)
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
    return out


def _claim_holders(cache: HybridPrefixCache, claims: _Claims) -> None:
    p = cache.page_size
    for h in cache.holders.values():
        me = claims.register(h.owner, h)
        claims.add(FULL_KV, Tier.DEVICE, h.own_full_pages(p), me)
        claims.add(SWA_KV, Tier.DEVICE, list(h.swa_pages.values()), me)
        for group, ids in h.working.items():
            claims.add(group, Tier.DEVICE, ids, me)
        for pend in h.pending.values():
            for group, ids in pend.pages.items():
                claims.add(group, Tier.DEVICE, ids, me)


def _claim_slots(cache: HybridPrefixCache, claims: _Claims) -> None:
    if cache.slots is None:
        return
    for slot in cache.slots.slots:
        me = claims.register(Owner(OwnerKind.SLOT, slot.index), slot)
        for group, ids in slot.pages.items():
            claims.add(group, Tier.DEVICE, ids, me)


def _audit_pool(
    pool: PagePool,
    group: str,
    tier: Tier,
    claims: _Claims,
    owners: np.ndarray,
) -> list[Finding]:
    out: list[Finding] = []
    label = group if tier is Tier.DEVICE else f"{group} (host)"
    snap = pool.view()
    pages, who = claims.arrays(group, tier)
    held = np.bincount(pages, minlength=pool.capacity)
    on_stack = np.bincount(snap.free_pages, minlength=pool.capacity)
    tagged = snap.owner_kind != int(OwnerKind.FREE)

    def tag(page: int) -> str:
        kind = OwnerKind(int(snap.owner_kind[page]))
        return "free" if kind is OwnerKind.FREE else str(Owner(kind, int(snap.owner_id[page])))

    def holders_of(page: int) -> str:
        return ", ".join(claims.describe(int(i)) for i in who[pages == page])

    twice_free = np.flatnonzero(on_stack > 1).tolist()
    if twice_free:
        out.append(
            finding(
                DOUBLE_OWNED,
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
                FREE_AND_OWNED,
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
                DOUBLE_OWNED,
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
                ORPHAN,
                group,
                orphans,
                f"{label}: {len(orphans)} allocated pages held by no live holder; last owners {dict(last.most_common(4))}",
            )
        )
    if pages.size:
        # Tags against claimants, one int64 compare per claimed page; a page
        # held twice is reported above, not again here.
        tags = owner_key(snap.owner_kind, snap.owner_id)
        bad_at = pages[tags[pages] != owners[who]]
        bad = bad_at[held[bad_at] == 1].tolist()
        if bad:
            p = bad[0]
            out.append(
                finding(
                    DOUBLE_OWNED,
                    group,
                    bad,
                    f"{label}: {len(bad)} pages tagged for another owner; page {p} tagged {tag(p)}, held by [{holders_of(p)}]",
                )
            )
    return out


def _audit_refs(cache: HybridPrefixCache, nodes: list[Node]) -> tuple[list[Finding], RootRefs]:
    device: Counter[int] = Counter()
    host: Counter[int] = Counter()
    for holder in cache.holders.values():
        if holder.lock_node is not None:
            for n in holder.lock_node.path():
                device[n.id] += 1
        if holder.anchor is not None:
            host[holder.anchor.id] += 1
    out = []
    want_device, want_host = device.get, host.get  # (not Counter's __missing__: hot loop)
    for node in nodes:
        if node.refs != want_device(node.id, 0) or node.host_refs != want_host(node.id, 0):
            what = "root" if node.is_root else f"node {node.id} (depth {node.depth})"
            out.append(
                finding(
                    REF_MISMATCH,
                    None,
                    [],
                    f"{what}: refs {node.refs}/host {node.host_refs}, live holders imply {device[node.id]}/{host[node.id]}",
                )
            )
    root = cache.tree.root
    return out, RootRefs(root.refs, device[root.id])


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
