"""One read-only view of SGLang's cache structures across releases: where their shapes differ.

The audit (``pool_audit.py``) checks pools against holders; what a holder
*is* changed between releases and is read here, by what the objects have:

* a request's KV record: on the ``Req`` itself (``req.req_pool_idx``,
  ``req.kv_allocated_len``; 0.5.4/0.5.5 have no ``kv_allocated_len``) or,
  from 0.5.16, on ``req.kv`` (``ReqKvInfo``: ``req_pool_idx``,
  ``kv_allocated_len``, ``cache_protected_len``, ``mamba_pool_idx``, the
  per-component evicted lengths); a session slot's record likewise
  (``slot`` or ``slot.kv``);
* tree nodes: ``TreeNode`` (``value``, ``mamba_value``, ``lock_ref`` or
  ``full_lock_ref`` / ``mamba_lock_ref``) or ``UnifiedTreeNode``
  (``component_data[ComponentType.X].value`` and ``.lock_ref``);
* who locks a path: a request's ``last_node`` (before the unified tree), its
  ``lock_receipt``'s node (the unified tree of 0.5.16 .. 0.5.21) or its
  ``TreeLock`` (``req.lock.node``, a node id; its receipt says which
  components it skipped), a session slot's likewise.

Invariant: these functions only read; nothing here changes SGLang's state.
A tree value that is neither a tensor nor empty (a stub that leaked into
SGLang's state) raises, so a stand-in can never pass for data.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

FULL, SWA, MAMBA = "full", "swa", "mamba"


def inner(cache: Any) -> Any:
    """The tree cache under a session wrapper (the cache itself when unwrapped)."""
    return cache.__dict__.get("inner", cache)


def session_slots(cache: Any) -> dict[str, Any]:
    """The streaming-session slots by session id: the wrapper's (0.5.10-0.5.20) or,
    from 0.5.22, those of the ``StreamingSession`` the unified cache owns."""
    owned = getattr(inner(cache), "__dict__", {}).get("session")
    for holder in (cache, owned):
        slots = getattr(holder, "__dict__", {}).get("slots")
        if isinstance(slots, dict):
            return slots
    return {}


class KvView(NamedTuple):
    """A request's or a session slot's KV record."""

    pool_idx: int | None  # its req_to_token row
    allocated: int  # [0, allocated) of the row is written
    committed: int | str  # "?" where the release has no such field
    protected: int  # [0, protected) of the row is the tree's (0 before 0.5.22)
    mamba: int | None  # its mamba slot
    swa_evicted: int  # [0, swa_evicted) of the row's SWA slots are freed


class NodeView(NamedTuple):
    """A tree node's values (tensors of pool indices, or None) and lock counts."""

    node: Any
    id: int
    full: Any
    swa: Any  # None: no SWA component, or tombstoned
    mamba: Any
    full_lock: int
    swa_lock: int | None
    mamba_lock: int | None


class Lock(NamedTuple):
    """A path lock anchored at ``node`` (a node object)."""

    who: str  # "request RID" or "session SID"
    node: Any
    mamba: bool  # the anchor's mamba state is locked too


COMPONENT_TYPES = (  # where a release defines ComponentType, newest first
    "sglang.srt.mem_cache.unified_cache.component_type",  # 0.5.17+
    "sglang.srt.mem_cache.unified_cache_components.tree_component",  # 0.5.16
)


def component_type(name: str) -> Any:
    """The release's ``ComponentType`` member (while the release is active), from the
    first of its modules that is the wheel's own (a stand-in has no file)."""
    for path in COMPONENT_TYPES:
        module = importlib.import_module(path)
        if getattr(module, "__file__", None):
            return getattr(module.ComponentType, name.upper())
    raise LookupError("the release defines no ComponentType")


def _int(x: Any) -> int | None:
    return None if x is None else int(x)


def _kv_record(obj: Any) -> Any:
    """``obj.kv`` when it is SGLang's ``ReqKvInfo`` (not a stub a stubbed base answers)."""
    record = getattr(obj, "kv", None)
    module = getattr(type(record), "__module__", "") or ""
    return record if module.startswith("sglang.") and hasattr(record, "kv_allocated_len") else None


def _from_record(obj: Any, record: Any) -> KvView:
    """0.5.16+; before 0.5.22 the row, the committed length and the mamba slot stay on the Req."""
    getter = getattr(record, "get_evicted_seqlen", None)
    swa = getter(component_type(SWA)) if getter else getattr(record, "swa_evicted_seqlen", 0)
    owner = record if hasattr(record, "req_pool_idx") else obj
    mamba_owner = record if hasattr(record, "mamba_pool_idx") else obj
    return KvView(
        pool_idx=owner.req_pool_idx,
        allocated=record.kv_allocated_len,
        committed=getattr(record, "kv_committed_len", getattr(obj, "kv_committed_len", "?")),
        protected=getattr(record, "cache_protected_len", 0),
        mamba=_int(getattr(mamba_owner, "mamba_pool_idx", None)),
        swa_evicted=swa or 0,
    )


def kv(obj: Any, *, chunked: bool = False) -> KvView:
    """The KV record of a request or a session slot (``chunked``: the request in
    the middle of a chunked prefill, before releases count its allocation)."""
    record = _kv_record(obj)
    if record is not None:
        return _from_record(obj, record)
    if hasattr(obj, "kv_allocated_len"):
        allocated = obj.kv_allocated_len
    elif chunked or getattr(obj, "is_chunked", 0) > 0:
        allocated = len(obj.fill_ids)
    else:
        allocated = len(obj.origin_input_ids) + max(len(obj.output_ids) - 1, 0)
    return KvView(
        pool_idx=obj.req_pool_idx,
        allocated=allocated,
        committed=getattr(obj, "kv_committed_len", "?"),
        protected=0,
        mamba=_int(getattr(obj, "mamba_pool_idx", None)),
        swa_evicted=getattr(obj, "swa_evicted_seqlen", 0) or 0,
    )


def core(cache: Any) -> Any:
    """What keeps the tree's nodes and counters: the unified cache's ``tree_core``
    (0.5.17+), else the cache itself (its own ``root_node``)."""
    tree = inner(cache)
    return getattr(tree, "tree_core", tree)


def is_unified(cache: Any) -> bool:
    """A tree of ``UnifiedTreeNode``s (per-component data), in a ``tree_core`` or,
    in 0.5.16, in the cache itself."""
    return hasattr(core(cache).root_node, "component_data")


def root(cache: Any) -> Any:
    return core(cache).root_node


def _node(cache: Any, ref: Any) -> Any:
    """A node named by id (a tree core's arena) or the node itself (0.5.16)."""
    return ref if hasattr(ref, "children") else core(cache)._node_arena.get(ref)


def _tensor(value: Any) -> Any:
    """A node's component value: a tensor, or None."""
    if value is None or hasattr(value, "tolist"):
        return value
    if isinstance(value, list) and not value:  # the root's FULL value is []
        return None
    raise TypeError(f"a tree node holds {value!r}: a stand-in leaked into SGLang's state")


def _unified_view(node: Any, present: dict[str, Any]) -> NodeView:
    """A ``UnifiedTreeNode``; ``present`` maps the cache's components to their types."""
    data = node.component_data

    def part(name: str, attr: str) -> Any:
        if name not in present:
            return None
        value = getattr(data[present[name]], attr)
        return _tensor(value) if attr == "value" else value

    return NodeView(
        node=node,
        id=node.id,
        full=_tensor(data[component_type(FULL)].value),
        swa=part(SWA, "value"),
        mamba=part(MAMBA, "value"),
        full_lock=data[component_type(FULL)].lock_ref,
        swa_lock=part(SWA, "lock_ref"),
        mamba_lock=part(MAMBA, "lock_ref"),
    )


def _legacy_view(node: Any, to_swa: Any) -> NodeView:
    """A ``TreeNode``; an ``SWARadixCache`` node keeps full indices and a tombstone flag."""
    value = _tensor(node.value)
    swa = None
    alive = hasattr(node, "swa_tombstone") and not node.swa_tombstone
    if to_swa is not None and value is not None and alive:
        swa = to_swa(value)
    return NodeView(
        node=node,
        id=node.id,
        full=value,
        swa=swa,
        mamba=getattr(node, "mamba_value", None),
        full_lock=node.lock_ref if hasattr(node, "lock_ref") else node.full_lock_ref,
        swa_lock=getattr(node, "swa_lock_ref", None),
        mamba_lock=getattr(node, "mamba_lock_ref", None),
    )


def nodes(cache: Any, to_swa: Any = None) -> list[NodeView]:
    """Every node, the root first. ``to_swa`` maps full KV indices to SWA ones."""
    present = {}
    if is_unified(cache):
        components = set(inner(cache).components)
        for name in (SWA, MAMBA):
            if (ct := component_type(name)) in components:
                present[name] = ct
    out, stack = [], [root(cache)]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        view = _unified_view(node, present) if is_unified(cache) else _legacy_view(node, to_swa)
        out.append(view)
    return out


def records_locks(req: Any) -> bool:
    """Whether a request records the lock it holds (a ``TreeLock`` from 0.5.22, a
    receipt in 0.5.20 and 0.5.21), so a waiting request's record says it holds none;
    before, a request's ``last_node`` is locked only while it runs."""
    own = vars(req)  # the instance's own fields: a stand-in base answers any name
    return "lock" in own or "lock_receipt" in own


def lock_of(obj: Any, who: str, cache: Any) -> Lock | None:
    """The lock a request or a session slot holds, if any (a request of a release
    that does not ``records_locks`` is asked only while it runs)."""
    if not is_unified(cache):
        node = getattr(obj, "last_node", None)
        held = node is not None and hasattr(node, "children")
        return Lock(who=who, node=node, mamba=True) if held else None
    own = getattr(obj, "__dict__", {})
    if "lock" in own:  # 0.5.22+: a TreeLock while it holds one, else None
        lock = obj.lock
        if lock is None or not isinstance(lock.node, int):
            return None
        node = _node(cache, lock.node)
        receipt = lock.receipt
    elif "lock_receipt" in own:  # 0.5.20, 0.5.21: the receipt names the locked node
        receipt = obj.lock_receipt
        if not isinstance(getattr(receipt, "node_id", None), int):
            return None
        node = _node(cache, receipt.node_id)
    else:  # 0.5.16 .. 0.5.19: last_node (a node or its id) while it runs
        last = getattr(obj, "last_node", None)
        if not isinstance(last, int) and not hasattr(last, "children"):
            return None
        node = _node(cache, last)
        skipped_ids = getattr(obj, "skip_lock_node_ids", None) or {}  # 0.5.17+
        mamba = getattr(node, "id", last) not in skipped_ids.get(component_type(MAMBA), ())
        return Lock(who=who, node=node, mamba=mamba) if node is not None else None
    skipped = set(getattr(receipt, "skipped_lock_components", ()))
    mamba = component_type(MAMBA) not in skipped
    return Lock(who=who, node=node, mamba=mamba) if node is not None else None


LEGACY_COUNTERS = (
    ("evictable_size_", "full.evictable"),
    ("protected_size_", "full.protected"),
    ("full_evictable_size_", "full.evictable"),
    ("full_protected_size_", "full.protected"),
    ("mamba_evictable_size_", "mamba.evictable"),
    ("mamba_protected_size_", "mamba.protected"),
    ("swa_evictable_size_", "swa.evictable"),
    ("swa_protected_size_", "swa.protected"),
)


def size_counters(cache: Any) -> dict[str, int]:
    """The tree's own size counters, by component: ``{"full.evictable": n, ...}``."""
    tree = inner(cache)
    if not is_unified(cache):
        return {key: getattr(tree, name) for name, key in LEGACY_COUNTERS if hasattr(tree, name)}
    counters = core(cache)
    out = {}
    for ct, evictable in counters.component_evictable_size_.items():
        out[f"{ct.name.lower()}.evictable"] = evictable
        out[f"{ct.name.lower()}.protected"] = counters.component_protected_size_[ct]
    return out


def session_records(cache: Any) -> dict[str, Any]:
    """The streaming-session slots, by session id."""
    return session_slots(cache)
