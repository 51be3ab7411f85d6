"""LightLLM's tree read for the ref-count and structure rules (read-only, duck-typed).

* ``node_refs``: every non-root node's ``ref_counter`` and the live requests
  anchored at it or below (what the counter must be: a request's
  ``shared_kv_node`` holds one ref on each node of its path);
* ``tree_counts``: the cache's two shared counters and a recount of its
  nodes (``tree_total_tokens_num``: every non-root node's tokens;
  ``refed_tokens_num``: those of nodes with a ref);
* ``eviction_problems``: the eviction set(s) against the tree. The plain
  ``RadixCache`` keeps every leaf in ``evict_tree_set``, the root too while
  it has no child (its ``ref_counter`` starts at 1 so that it sorts last,
  and ``evict`` asserts it never gets it). The ``LinearAttPagedRadixCache``
  keeps every leaf but the root in ``_evict_tree_set`` (its ``_add_node``
  leaves the root out since PR #1348; before, an empty tree put the root in
  it), and in ``_evict_tree_set_for_linear_att`` every node holding a
  small-page buffer.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kvwatch.targets.lightllm.slot_audit import NodeRefs, TreeCounts
from kvwatch.targets.lightllm.state_read import node_name


def node_refs(nodes: list[Any], anchored: Counter) -> list[NodeRefs]:
    return [
        NodeRefs(who=node_name(n), ref_counter=int(n.ref_counter), anchored=anchored[id(n)])
        for n in nodes[1:]
    ]


def tree_counts(radix: Any, nodes: list[Any]) -> TreeCounts:
    held = [len(n.token_mem_index_value) for n in nodes[1:]]
    refed = [len(n.token_mem_index_value) for n in nodes[1:] if n.ref_counter > 0]
    return TreeCounts(
        total=int(radix.tree_total_tokens_num.arr[0]),
        refed=int(radix.refed_tokens_num.arr[0]),
        total_recount=sum(held),
        refed_recount=sum(refed),
    )


def _set_ids(container: Any) -> set[int]:
    return {id(n) for n in container}


def eviction_problems(radix: Any, nodes: list[Any], *, linear: bool) -> list[str]:
    root = nodes[0]
    name = "_evict_tree_set" if linear else "evict_tree_set"
    in_set = _set_ids(getattr(radix, name))
    out = []
    if linear and id(root) in in_set:
        out.append(f"the root is in {name} (the tree is empty; the root must never be evicted)")
        in_set.discard(id(root))
    leaves = {id(n) for n in nodes if n.is_leaf() and not (linear and n is root)}
    if in_set - leaves:
        out.append(f"{name} holds {len(in_set - leaves)} nodes that are not leaves of the tree")
    if leaves - in_set:
        missing = [node_name(n) for n in nodes[1:] if id(n) in leaves - in_set]
        out.append(f"{name} misses {len(leaves - in_set)} leaves: {', '.join(missing[:4])}")
    if linear:
        with_buffer = {id(n) for n in nodes if n.small_page_buffer_idx is not None}
        if _set_ids(radix._evict_tree_set_for_linear_att) != with_buffer:
            out.append("_evict_tree_set_for_linear_att is not the nodes with a small-page buffer")
    return out
