"""The audit of one pool, the tree's locks and its size counters, as kvwatch findings.

Pure functions over what ``pool_holders`` read (so they are tested without
a release):

* ``audit_group``: every unit a pool has given out must be held by someone
  (``kvwatch.targets.unit_audit``). Allocated and held by nobody is an
  ``ORPHAN`` (its detail names the last holder seen, as ``last`` describes
  it); on the free list twice, held by two tree nodes, held outside the
  tree by two holders, or free or held outside the pool (the padding page 0,
  a page past the allocator's last) is ``DOUBLE_OWNED`` (requests sharing a
  cached prefix all reference the tree's pages, which is fine: SGLang's
  ``RULES``); free and held is ``FREE_AND_OWNED``. Together these are the
  pool's accounting identity, page by page: every page of the pool is
  exactly one of free, in the tree (evictable at lock 0, else protected) or
  held outside the tree by live requests and session slots, and those
  counts sum to the pool's size.
* ``audit_locks``: each node's lock count against the path locks the live
  holders hold (full: every node from the anchor to the root; mamba, on a
  unified tree: the anchor only): ``REF_MISMATCH``.
* ``audit_counters``: the tree's own evictable / protected size counters
  (tokens) against a recount of its nodes, and at page size > 1 against the
  pages its nodes cover (SGLang's trees keep whole pages: a node that keeps
  part of one pins the page while the counters count only its tokens):
  ``TREE``.

Invariant: a finding's detail names SGLang's objects (request ids, session
ids, tree node ids, pool indices), never kvwatch's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvwatch.contracts import Finding, FindingKind, finding
from kvwatch.targets.sglang.cache_views import Lock, NodeView
from kvwatch.targets.sglang.pool_holders import KV, Holding
from kvwatch.targets.unit_audit import SHOWN, UnitRules, audit_units


def _twice(holders: Sequence[Holding]) -> bool:
    """Requests sharing a cached prefix all reference the tree's pages: only two
    tree nodes, or two holders outside the tree, hold a unit twice."""
    in_tree = [h for h in holders if h.owner == "tree"]
    return len(in_tree) > 1 or (not in_tree and len(holders) > 1)


RULES = UnitRules(holders="no request, session slot or tree node", twice=_twice, outside=True)


def audit_group(
    group: str,
    free: Sequence[int],
    universe: set[int],
    held: Sequence[Holding],
    last: Callable[[str, int], str],
) -> tuple[list[Finding], Counter]:
    """The findings of one pool, and its held units by owner kind (a unit the tree
    holds counts as the tree's)."""
    return audit_units(group, free, universe, held, last, RULES)


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


def _pages(value: Any, page: int) -> int:
    """How many pages a node's value (pool indices) covers."""
    slots = value.tolist() if hasattr(value, "tolist") else value
    return len({int(s) // page for s in slots})


def audit_counters(
    nodes: Sequence[NodeView], counters: Mapping[str, int], cache: str, page: int = 1
) -> list[Finding]:
    """The tree's size counters (``cache_views.size_counters``, in tokens) against a
    recount of its nodes' values, by component and lock state; at ``page`` > 1 also
    against the tokens of the pages the nodes cover (full and SWA: mamba slots are
    no pages). ``cache`` names the tree's class."""
    recount: Counter = Counter()
    pages: Counter = Counter()
    partial: dict[str, list[str]] = {}
    for n in nodes[1:]:
        parts = (("full", n.full, n.full_lock), ("swa", n.swa, n.swa_lock))
        for comp, value, lock in (*parts, ("mamba", n.mamba, n.mamba_lock)):
            if value is None or lock is None:
                continue
            key = f"{comp}.{'evictable' if lock == 0 else 'protected'}"
            recount[key] += len(value)
            if page > 1 and comp != "mamba":
                covered = _pages(value, page)
                pages[key] += covered
                if len(value) != covered * page:
                    partial.setdefault(key, []).append(
                        f"tree node {n.id} holds {len(value)} tokens on {covered} pages"
                    )
    out = []
    for key, value in counters.items():
        if value != recount[key]:
            detail = f"{KV}: {cache} {key} is {value}, the nodes hold {recount[key]}"
        elif page > 1 and key in pages and value != pages[key] * page:
            named = "; ".join(partial.get(key, [])[:SHOWN])
            detail = (
                f"{KV}: {cache} {key} is {value} tokens, the nodes cover {pages[key]} pages "
                f"of {page} ({pages[key] * page} tokens): {named}"
            )
        else:
            continue
        out.append(finding(FindingKind.TREE, KV, [], detail))
    return out
