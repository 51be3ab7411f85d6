"""The audit of LightLLM's pools, ref counts and tree, as kvwatch findings (pure functions).

Over what ``state_read`` read (so hand-built structures are audited the
same way):

* ``audit_pool``: each unit of a pool is free, or held by exactly one tree
  node or live request (``kvwatch.targets.unit_audit`` by LightLLM's
  ``RULES``). Held by nobody: ``ORPHAN`` (a leak; the detail names the
  unit's last holder, as ``last`` describes it); on the free list twice,
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
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from kvwatch.contracts import NOTICE, Finding, FindingKind, finding
from kvwatch.targets.lightllm.state_read import STATE, Holding, PoolView
from kvwatch.targets.unit_audit import SHOWN, UnitRules, audit_units


def _twice(holders: Sequence[Holding]) -> bool:
    """Any two holders of one unit: a request's holding leaves out its anchor's path
    in the tree (``state_read`` reads that apart), so nothing is shared."""
    return len(holders) > 1


RULES = UnitRules(holders="no tree node or live request", twice=_twice, outside=True)


def audit_pool(view: PoolView, last: Callable[[str, int], str]) -> tuple[list[Finding], Counter]:
    """The findings of one pool, and its held units by owner kind."""
    return audit_units(view.group, view.free, view.universe, view.holdings, last, RULES)


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


def notice_root_drift(group: str, ref_counter: int, anchored: int) -> list[Finding]:
    """The linear cache's root counter above its pin plus its anchors: the refs its
    ``match_prefix`` keeps on a miss or a trim to nothing, by design (``probe.py``).
    Harmless today, so a notice (``contracts.NOTICE``), never a pass: a drift whose
    release its maintainers took out of a fix is what a user may want to hear of."""
    if ref_counter <= anchored + 1:
        return []
    detail = (
        f"{group}: the root's ref_counter {ref_counter} is above 1 + {anchored} anchored: "
        f"{ref_counter - anchored - 1} refs taken on the root and never given back "
        "(LightLLM's linear cache keeps them by design; nothing reads the count)"
    )
    return [finding(FindingKind.REF_MISMATCH, group, [], detail, key="root-drift", severity=NOTICE)]


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
