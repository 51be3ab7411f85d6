"""The audit of LightLLM's pools, ref counts and tree, as kvwatch findings (pure functions).

Over what ``state_read`` read (so hand-built structures are audited the
same way):

* ``audit_pool``: each unit of a pool is free, or held by exactly one tree
  node or live request. Held by nobody: ``ORPHAN`` (a leak; the detail names
  the unit's last holder, as ``last`` describes it); on the free list twice,
  held twice, or held outside the pool: ``DOUBLE_OWNED``; free and held:
  ``FREE_AND_OWNED``. These are the ``allocator`` detector's;
* ``audit_stale``: pending big pages a live request holds past its KV: no
  insert can give them to the tree and nothing else frees them (a paused
  or aborted chunked prefill): ``ORPHAN`` in ``lightllm.state``;
* ``audit_refs``: every non-root node's ``ref_counter`` against the live
  requests anchored at it or below: ``REF_MISMATCH`` (``refcount``). The
  root is judged apart (``root_refs``: the probe's ``RootRefs``);
* ``audit_tree``: the cache's ``tree_total_tokens_num`` / ``refed_tokens_num``
  against a recount, the eviction sets against the leaves (and, for the
  linear cache, the root never in its eviction set, the small-page set the
  nodes with a small-page buffer): ``TREE`` (``tree``).

Invariant: a finding's detail names LightLLM's objects (request ids, tree
nodes by prefix range, pool indices), never kvwatch's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from kvwatch.contracts import Finding, FindingKind, finding
from kvwatch.targets.lightllm.state_read import STATE, Holding, PoolView

SHOWN = 8


def ranges(units: Iterable[int]) -> str:
    """``3-5, 9``: sorted units as ranges (the first ``SHOWN``, then a count)."""
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


def owners_of(holdings: Iterable[Holding]) -> dict[int, list[Holding]]:
    owners: dict[int, list[Holding]] = {}
    for h in holdings:
        for u in h.units:
            owners.setdefault(u, []).append(h)
    return owners


def _double(group: str, free: Counter, owners: dict, universe: range) -> list[Finding]:
    out = []
    twice = sorted(u for u, c in free.items() if c > 1)
    if twice:
        detail = f"{group}: {len(twice)} units on the free list twice: {ranges(twice)}"
        out.append(finding(FindingKind.DOUBLE_OWNED, group, twice, detail))
    for u, hs in sorted((u, hs) for u, hs in owners.items() if len(hs) > 1)[:4]:
        detail = f"{group}: unit {u} held by " + " and ".join(h.who for h in hs)
        out.append(finding(FindingKind.DOUBLE_OWNED, group, [u], detail))
    outside = sorted(u for u in set(free) | set(owners) if u not in universe)
    if outside:
        detail = (
            f"{group}: units outside the pool's {len(universe)} free or held: {ranges(outside)}"
        )
        out.append(finding(FindingKind.DOUBLE_OWNED, group, outside, detail))
    return out


def _free_and_held(group: str, free: Counter, owners: dict) -> list[Finding]:
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
        f"{group}: {len(orphans)} units allocated but held by no tree node or live request: "
        f"{ranges(orphans)} ({named})"
    )
    return [finding(FindingKind.ORPHAN, group, orphans, detail)]


def audit_pool(view: PoolView, last: Callable[[str, int], str]) -> tuple[list[Finding], Counter]:
    """The findings of one pool, and its held units by owner kind."""
    free = Counter(view.free)
    owners = owners_of(view.holdings)
    orphans = sorted(set(view.universe) - set(free) - set(owners))
    found = _double(view.group, free, owners, view.universe)
    found += _free_and_held(view.group, free, owners)
    found += _orphans(view.group, orphans, last)
    counts: Counter = Counter()
    for hs in owners.values():
        counts["tree" if any(h.owner == "tree" for h in hs) else hs[0].owner] += 1
    return found, counts


def audit_stale(stale: list[tuple[Any, dict]]) -> list[Finding]:
    out = []
    for req, past in stale:
        state = "paused" if req.paused else f"cur_kv_len {req.cur_kv_len}"
        detail = (
            f"{STATE}: request {req.req_id} ({state}) holds big pages {past} pending past its "
            f"KV: no insert takes them and nothing frees them"
        )
        out.append(finding(FindingKind.ORPHAN, STATE, sorted(past.values()), detail))
    return out


def audit_prefixes(group: str, mismatches: list[str]) -> list[Finding]:
    """A live request whose row's prefix is not its anchor's path reads KV the tree
    holds for another prefix (or no longer holds): the slots have two owners."""
    return [finding(FindingKind.DOUBLE_OWNED, group, [], f"{group}: {m}") for m in mismatches]


class NodeRefs(NamedTuple):
    who: str
    ref_counter: int
    anchored: int  # live requests anchored at the node or below


def audit_refs(group: str, refs: list[NodeRefs]) -> list[Finding]:
    bad = [r for r in refs if r.ref_counter != r.anchored]
    return [
        finding(
            FindingKind.REF_MISMATCH,
            group,
            [],
            f"{group}: {r.who} ref_counter {r.ref_counter}, live requests anchored at or "
            f"below it {r.anchored}",
        )
        for r in bad[:SHOWN]
    ]


def audit_root_floor(group: str, ref_counter: int, anchored: int) -> list[Finding]:
    """The root's counter below its pin plus its anchors: a release went past it."""
    if ref_counter >= anchored + 1:
        return []
    detail = f"{group}: the root's ref_counter {ref_counter} is below 1 + {anchored} anchored"
    return [finding(FindingKind.REF_MISMATCH, group, [], detail)]


class TreeCounts(NamedTuple):
    total: int  # the cache's tree_total_tokens_num
    refed: int  # the cache's refed_tokens_num
    total_recount: int
    refed_recount: int


def audit_tree(group: str, counts: TreeCounts, set_problems: list[str]) -> list[Finding]:
    out = [finding(FindingKind.TREE, group, [], f"{group}: {p}") for p in set_problems]
    if (counts.total, counts.refed) != (counts.total_recount, counts.refed_recount):
        detail = (
            f"{group}: tree_total_tokens_num {counts.total} (the nodes hold "
            f"{counts.total_recount}), refed_tokens_num {counts.refed} (recount "
            f"{counts.refed_recount})"
        )
        out.append(finding(FindingKind.TREE, group, [], detail))
    return out
