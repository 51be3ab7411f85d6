"""Who holds which unit of LightLLM's pools, read from its own structures (read-only).

The pools and who may hold a unit of each (group names are kvwatch's):

* ``lightllm.kv``, KV token slots (``mem_manager.allocator``, ``0 .. size-1``):
  free is ``mem_state[mark_start:mark_end]``; a tree node holds its
  ``token_mem_index_value``; a live request holds
  ``req_to_token_indexs[req_idx, shared:cur_kv_len]`` (``[0:shared)`` is its
  anchor's path in the tree, read apart: ``prefix_mismatches``);
* ``lightllm.req``, request slots (``req_manager.req_list``): used
  (``marks``) by a live ``InferReq``'s ``req_idx``;
* ``lightllm.state``, the big-page linear-attention state buffers
  (``mem_manager.linear_att_big_page_buffers``, ``0 .. size-keep_num-1``):
  free list; a big-page tree node's ``big_page_buffer_idx``; a live
  request's pending ``linear_att_len_to_big_page_id`` (taken at each
  big-page boundary of a chunked prefill, given to the tree at its insert);
* ``lightllm.small_state``, the small-page state buffers (the cache's
  ``linear_att_small_page_buffers``): free list; a node's
  ``small_page_buffer_idx``; a live request's
  ``tail_linear_att_small_page_buffer_id``.

Everything is duck-typed on LightLLM's attribute names, so hand-built
structures read the same (the tests build them). ``Holding.who`` names
LightLLM's objects: ``tree node [16:32)``, ``request 7``, ``request 7
pending big page at 16``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

KV, REQ, STATE, SMALL = "lightllm.kv", "lightllm.req", "lightllm.state", "lightllm.small_state"


class Holding(NamedTuple):
    who: str
    owner: str  # tree or request
    rid: int | None
    units: tuple[int, ...]


class PoolView(NamedTuple):
    group: str
    universe: range
    free: list[int]
    holdings: list[Holding]


def ints(values: Any) -> list[int]:
    """A tensor, array or sequence of ids as Python ints."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [int(v) for v in values]


def nodes_of(radix: Any) -> list[Any]:
    """The tree's nodes, the root first, parents before children."""
    out, queue = [], [radix.root_node]
    while queue:
        node = queue.pop(0)
        out.append(node)
        queue.extend(node.children.values())
    return out


def node_name(node: Any) -> str:
    end = int(node.node_prefix_total_len)
    return f"tree node [{end - len(node.token_mem_index_value)}:{end})"


def shared_len(req: Any) -> int:
    node = req.shared_kv_node
    return 0 if node is None else int(node.node_prefix_total_len)


def kv_pool(mem: Any, req_manager: Any, nodes: list[Any], live: list[Any]) -> PoolView:
    allocator = mem.allocator
    free = ints(allocator.mem_state[allocator.mark_start : allocator.mark_end])
    holdings = [
        Holding(
            who=node_name(n), owner="tree", rid=None, units=tuple(ints(n.token_mem_index_value))
        )
        for n in nodes[1:]
    ]
    rows = req_manager.req_to_token_indexs
    for r in live:
        units = tuple(ints(rows[r.req_idx, shared_len(r) : r.cur_kv_len]))
        holdings.append(
            Holding(who=f"request {r.req_id}", owner="request", rid=r.req_id, units=units)
        )
    return PoolView(group=KV, universe=range(int(allocator.size)), free=free, holdings=holdings)


def req_pool(req_manager: Any, live: list[Any]) -> PoolView:
    marks = list(req_manager.req_list.marks)
    free = [i for i, used in enumerate(marks) if not used]
    holdings = [
        Holding(who=f"request {r.req_id}", owner="request", rid=r.req_id, units=(int(r.req_idx),))
        for r in live
    ]
    return PoolView(group=REQ, universe=range(len(marks)), free=free, holdings=holdings)


def _buffers(buffers: Any) -> tuple[range, list[int]]:
    return range(int(buffers.size) - int(buffers.keep_num)), ints(buffers.free_list)


def big_page_pool(mem: Any, nodes: list[Any], live: list[Any]) -> PoolView:
    universe, free = _buffers(mem.linear_att_big_page_buffers)
    holdings = [
        Holding(who=node_name(n), owner="tree", rid=None, units=(int(n.big_page_buffer_idx),))
        for n in nodes[1:]
        if n.big_page_buffer_idx is not None
    ]
    for r in live:
        for at, page in (r.linear_att_len_to_big_page_id or {}).items():
            who = f"request {r.req_id} pending big page at {at}"
            holdings.append(Holding(who=who, owner="request", rid=r.req_id, units=(int(page),)))
    return PoolView(group=STATE, universe=universe, free=free, holdings=holdings)


def small_page_pool(small: Any, nodes: list[Any], live: list[Any]) -> PoolView:
    universe, free = _buffers(small)
    holdings = [
        Holding(who=node_name(n), owner="tree", rid=None, units=(int(n.small_page_buffer_idx),))
        for n in nodes
        if n.small_page_buffer_idx is not None
    ]
    holdings += [
        Holding(
            who=f"request {r.req_id} tail",
            owner="request",
            rid=r.req_id,
            units=(int(r.tail_linear_att_small_page_buffer_id),),
        )
        for r in live
        if r.tail_linear_att_small_page_buffer_id is not None
    ]
    return PoolView(group=SMALL, universe=universe, free=free, holdings=holdings)


def anchors(live: list[Any]) -> Counter:
    """Per node (by ``id``): the live requests anchored at it or below it."""
    out: Counter = Counter()
    for r in live:
        node = r.shared_kv_node
        while node is not None:
            out[id(node)] += 1
            node = node.parent
    return out


def path_units(node: Any) -> list[int]:
    """The KV slots of the path from the root to ``node``, in order."""
    parts = []
    while node is not None:
        parts.append(ints(node.token_mem_index_value))
        node = node.parent
    return [u for part in reversed(parts) for u in part]


def prefix_mismatches(req_manager: Any, live: list[Any]) -> list[str]:
    """Live requests whose row's ``[0:shared)`` is not their anchor's path."""
    out = []
    for r in live:
        if r.shared_kv_node is None:
            continue
        n = shared_len(r)
        if ints(req_manager.req_to_token_indexs[r.req_idx, :n]) != path_units(r.shared_kv_node):
            out.append(f"request {r.req_id}: its slots [0:{n}) are not its anchor's tree path")
    return out


def stale_pending(live: list[Any]) -> list[tuple[Any, dict]]:
    """Live requests holding pending big pages past their KV (``at > cur_kv_len``):
    no insert can hand those to the tree (it inserts at most ``cur_kv_len``)."""
    out = []
    for r in live:
        pending = dict(r.linear_att_len_to_big_page_id or {})
        past = {at: page for at, page in pending.items() if at > r.cur_kv_len}
        if past:
            out.append((r, past))
    return out
