"""The audit of one pool, the tree's locks and its size counters, as kvwatch findings.

Pure functions over what ``pool_holders`` read (so they are tested without
a release):

* ``audit_group``: every unit a pool has given out must be held by someone.
  Allocated and held by nobody is an ``ORPHAN`` (its detail names the last
  holder seen, as ``last`` describes it); on the free list twice, held by two
  tree nodes, or held outside the tree by two holders is ``DOUBLE_OWNED``
  (requests sharing a cached prefix all reference the tree's pages, which is
  fine); free and held is ``FREE_AND_OWNED``.
* ``audit_locks``: each node's lock count against the path locks the live
  holders hold (full: every node from the anchor to the root; mamba, on a
  unified tree: the anchor only): ``REF_MISMATCH``.
* ``audit_counters``: the tree's own evictable / protected size counters
  against a recount of its nodes: ``TREE``.

Invariant: a finding's detail names SGLang's objects (request ids, session
ids, tree node ids, pool indices), never kvwatch's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from kvwatch.contracts import Finding, FindingKind, finding
from kvwatch.targets.sglang.cache_views import Lock, NodeView
from kvwatch.targets.sglang.pool_holders import KV, Holding

SHOWN = 8  # ranges, holders and mismatches named in one finding


def ranges(units: Iterable[int]) -> str:
    """``3-5, 9, 12-13``: sorted units as ranges (the first ``SHOWN``, then a count)."""
    units = sorted(units)
    out: list[str] = []
    start = None
    for i, u in enumerate(units):
        start = u if start is None else start
        if i + 1 == len(units) or units[i + 1] != u + 1:
            out.append(f"{start}" if start == u else f"{start}-{u}")
            start = None
    more = f" (+{len(out) - SHOWN} ranges)" if len(out) > SHOWN else ""
    return ", ".join(out[:SHOWN]) + more


def owners_of(held: Sequence[Holding]) -> dict[int, list[Holding]]:
    owners: dict[int, list[Holding]] = {}
    for h in held:
        for u in h.units:
            owners.setdefault(u, []).append(h)
    return owners


def _double(group: str, free: Counter, owners: dict[int, list[Holding]]) -> list[Finding]:
    out = []
    twice_free = sorted(u for u, c in free.items() if c > 1)
    if twice_free:
        detail = f"{group}: {len(twice_free)} units on the free list twice: {ranges(twice_free)}"
        out.append(finding(FindingKind.DOUBLE_OWNED, group, twice_free, detail))
    double = {}
    for u, hs in owners.items():
        in_tree = [h for h in hs if h.owner == "tree"]
        if len(in_tree) > 1 or (not in_tree and len(hs) > 1):
            double[u] = hs
    for u, hs in sorted(double.items())[:4]:
        detail = f"{group}: unit {u} held by " + " and ".join(h.who for h in hs)
        out.append(finding(FindingKind.DOUBLE_OWNED, group, [u], detail))
    return out


def _free_and_held(group: str, free: Counter, owners: dict[int, list[Holding]]) -> list[Finding]:
    both = sorted(u for u in owners if u in free)
    if not both:
        return []
    who = "; ".join(sorted({h.who for u in both[:SHOWN] for h in owners[u]}))
    detail = f"{group}: {len(both)} units free and held: {ranges(both)} by {who}"
    return [finding(FindingKind.FREE_AND_OWNED, group, both, detail)]


def _orphans(group: str, orphans: list[int], last: Callable[[str, int], str]) -> list[Finding]:
    if not orphans:
        return []
    lasts = Counter(last(group, u) for u in orphans)
    named = "; ".join(f"{n} last held by {who}" for who, n in lasts.most_common(6))
    detail = (
        f"{group}: {len(orphans)} units allocated but held by no request, session slot or "
        f"tree node: {ranges(orphans)} ({named})"
    )
    return [finding(FindingKind.ORPHAN, group, orphans, detail)]


def audit_group(
    group: str,
    free: Sequence[int],
    universe: set[int],
    held: Sequence[Holding],
    last: Callable[[str, int], str],
) -> tuple[list[Finding], Counter]:
    """The findings of one pool, and its held units by owner kind (a unit the tree
    holds counts as the tree's)."""
    free_count = Counter(free)
    owners = owners_of(held)
    orphans = sorted(universe - set(free_count) - set(owners))
    found = _double(group, free_count, owners) + _free_and_held(group, free_count, owners)
    found += _orphans(group, orphans, last)
    counts: Counter = Counter()
    for hs in owners.values():
        counts["tree" if any(h.owner == "tree" for h in hs) else hs[0].owner] += 1
    return found, counts


def _expected_locks(nodes: Sequence[NodeView], locks: Sequence[Lock]):
    """Per node object id: full locks, mamba locks and who holds them."""
    by_obj = {id(n.node) for n in nodes}
    root = nodes[0].node
    full: Counter = Counter()
    mamba: Counter = Counter()
    names: dict[int, list[str]] = {}
    for lock in locks:
        if lock.mamba and id(lock.node) in by_obj:
            mamba[id(lock.node)] += 1
        node = lock.node
        while node is not None and id(node) in by_obj and node is not root:
            full[id(node)] += 1
            names.setdefault(id(node), []).append(lock.who)
            node = node.parent
    return full, mamba, names


def audit_locks(
    nodes: Sequence[NodeView], locks: Sequence[Lock], *, unified: bool
) -> list[Finding]:
    """Every node's lock refs against the locks its live holders hold."""
    full, mamba, names = _expected_locks(nodes, locks)
    bad: list[tuple[NodeView, str]] = []
    for n in nodes[1:]:
        key = id(n.node)
        if n.full_lock != full[key]:
            bad.append(
                (n, f"tree node {n.id} lock ref {n.full_lock}, live holders imply {full[key]}")
            )
        checked = unified and n.mamba_lock is not None and n.mamba is not None
        if checked and n.mamba_lock != mamba[key]:
            text = (
                f"tree node {n.id} mamba lock ref {n.mamba_lock}, live holders imply {mamba[key]}"
            )
            bad.append((n, text))
    out = []
    for n, text in bad[:SHOWN]:
        who = ", ".join(names.get(id(n.node), [])) or "none"
        out.append(finding(FindingKind.REF_MISMATCH, KV, [], f"{KV}: {text} ({who})"))
    return out


def audit_counters(
    nodes: Sequence[NodeView], counters: Mapping[str, int], cache: str
) -> list[Finding]:
    """The tree's size counters (``cache_views.size_counters``) against a recount of
    its nodes' values, by component and lock state; ``cache`` names the tree's class."""
    recount: Counter = Counter()
    for n in nodes[1:]:
        parts = (("full", n.full, n.full_lock), ("swa", n.swa, n.swa_lock))
        for comp, value, lock in (*parts, ("mamba", n.mamba, n.mamba_lock)):
            if value is not None and lock is not None:
                recount[f"{comp}.{'evictable' if lock == 0 else 'protected'}"] += len(value)
    return [
        finding(
            FindingKind.TREE,
            KV,
            [],
            f"{KV}: {cache} {key} is {value}, the nodes hold {recount[key]}",
        )
        for key, value in counters.items()
        if value != recount[key]
    ]
