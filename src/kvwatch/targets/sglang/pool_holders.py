"""Who holds which units of SGLang's pools, read from SGLang's own structures.

Units are pages (token slots at page size 1). Three pools, each a kvwatch
group:

* ``sglang.kv``: the token-to-KV allocator (the full-attention side of an
  SWA allocator);
* ``sglang.swa``: the SWA sub-allocator of a hybrid sliding-window cache,
  its units reached through the allocator's ``full_to_swa_index_mapping``;
* ``sglang.mamba``: the mamba state slots of a hybrid SSM cache.

Holders, named by SGLang's objects: a tree node's value per component
(``tree node ID``); a live request's ``req_to_token`` row up to its
allocated length (SWA: from its SWA eviction cursor on) and its
``mamba_pool_idx`` (``request RID (session SID) req_to_token row N ...``); a
streaming-session slot's row and mamba slot (``session SID SessionSlot row
N ...``), counted once when a live turn borrows the slot's row (a retracted
request waiting with a row already on the pool's free list holds none). Free: the
allocator's free, release and staged lists and any open free group.

Invariant: reading only (through ``cache_views``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kvwatch.targets.sglang import cache_views
from kvwatch.targets.sglang.cache_views import NodeView

KV, SWA, MAMBA = "sglang.kv", "sglang.swa", "sglang.mamba"
GROUPS = (KV, SWA, MAMBA)


class Holding(NamedTuple):
    """Units of one pool one holder has."""

    owner: str  # "tree", "request" or "session"
    who: str  # the holder, named by SGLang's objects
    units: tuple[int, ...]
    rid: str | None = None  # a request's id


def open_group(allocator: Any, attr: str = "free_group") -> list:
    """The frees an allocator holds back in an open free group. Before 0.5.22 the
    group's list outlives ``free_group_end`` (which frees it and sets
    ``is_not_in_free_group``) until the next begin: it is open only while that
    flag is False; from 0.5.22 a closed group is None."""
    if getattr(allocator, "is_not_in_free_group", False) is True:
        return []
    return getattr(allocator, attr, None) or []


def free_units(allocator: Any, page: int, group_attr: str = "free_group") -> list[int]:
    """An allocator's free units: its free, release and staged lists, and the frees
    held in an open free group (page ids at page size > 1)."""
    units: list[int] = []
    for name in ("free_pages", "release_pages"):
        lst = getattr(allocator, name, None)
        if lst is not None:
            units += [int(x) for x in lst.tolist()]
    for staged in getattr(allocator, "staged_pages", None) or []:
        units += [int(x) for x in staged.tolist()]
    group = open_group(allocator, group_attr)
    units += sorted({int(x) // page for g in group for x in g.tolist()})
    return units


class PoolReader:
    """Reads one loop's pools: free units and who holds the rest."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.page = loop.config.pools.page_size
        self.swa = loop.pools.swa

    def kv_free(self) -> list[int]:
        allocator = self.loop.pools.allocator
        units = free_units(getattr(allocator, "full_attn_allocator", None) or allocator, self.page)
        if self.swa:  # the composite allocator's own free group holds full indices
            groups = open_group(allocator)
            units += sorted({int(x) // self.page for g in groups for x in g.tolist()})
        return units

    def swa_free(self) -> list[int]:
        allocator = self.loop.pools.allocator
        groups = open_group(allocator, "swa_free_group")
        extra = sorted({int(x) // self.page for g in groups for x in g.tolist()})
        return free_units(allocator.swa_attn_allocator, self.page) + extra

    def mamba_free(self) -> list[int] | None:
        slots = self.loop.pools.mamba_slots
        return None if slots is None else [int(x) for x in slots.free_slots.tolist()]

    def units(self, tokens: Any) -> tuple[int, ...]:
        if tokens is None:
            return ()
        return tuple(sorted({int(t) // self.page for t in tokens.tolist()}))

    def row(self, pool_idx: int, start: int, end: int) -> Any:
        table = self.loop.pools.req_to_token_pool.req_to_token
        return table[pool_idx, start:end] if end > start else None

    def swa_units(self, pool_idx: int, start: int, end: int) -> tuple[int, ...]:
        row = self.row(pool_idx, start, end)
        if row is None:
            return ()
        mapped = self.loop.pools.allocator.full_to_swa_index_mapping[row.long()]
        return tuple(sorted({int(t) // self.page for t in mapped.tolist() if int(t) > 0}))

    def nodes(self) -> list[NodeView]:
        mapping = None
        if self.swa:
            table = self.loop.pools.allocator.full_to_swa_index_mapping
            mapping = lambda full: table[full.long()]  # noqa: E731
        return cache_views.nodes(self.loop.tree_cache, mapping)

    def holdings(self, nodes: list[NodeView]) -> dict[str, list[Holding]]:
        """Every holder's units, per group."""
        held: dict[str, list[Holding]] = {group: [] for group in GROUPS}
        self._tree(nodes, held)
        rows = self._requests(held)
        self._sessions(held, rows)
        return held

    def _tree(self, nodes: list[NodeView], held: dict[str, list[Holding]]) -> None:
        for n in nodes[1:]:
            if n.full is not None:
                who = f"tree node {n.id} ({len(n.full)} tokens, lock {n.full_lock})"
                held[KV].append(Holding(owner="tree", who=who, units=self.units(n.full)))
            if n.swa is not None:
                who = f"tree node {n.id} (swa, lock {n.swa_lock})"
                held[SWA].append(Holding(owner="tree", who=who, units=self.units(n.swa)))
            if n.mamba is not None:
                mamba = tuple(int(x) for x in n.mamba.tolist())
                held[MAMBA].append(
                    Holding(owner="tree", who=f"tree node {n.id} (mamba)", units=mamba)
                )

    def _requests(self, held: dict[str, list[Holding]]) -> set[int]:
        """The live requests' rows and mamba slots; the rows they hold."""
        rows = set()
        for req in self.loop.live_requests():
            session = getattr(getattr(req, "session", None), "session_id", None)
            tag = f"request {req.rid}" + (f" (session {session})" if session else "")
            kv = cache_views.kv(req, chunked=req is self.loop.chunked_req)
            if self._stale_row(req, kv.pool_idx):
                kv = kv._replace(pool_idx=None)
            if kv.pool_idx is not None:
                rows.add(kv.pool_idx)
                self._row_holder(held, "request", f"{tag} req_to_token row", kv, req.rid)
            if kv.mamba is not None:
                who = f"{tag} mamba_pool_idx {kv.mamba}"
                held[MAMBA].append(
                    Holding(owner="request", who=who, units=(kv.mamba,), rid=req.rid)
                )
        return rows

    def _stale_row(self, req: Any, pool_idx: int | None) -> bool:
        """A retracted request waiting to be admitted again whose row is back on the
        pool's free list holds no row: 0.5.4.post3 and 0.5.5 free a retracted
        request's row and leave ``req_pool_idx`` pointing at it until re-admission."""
        if pool_idx is None or not getattr(req, "is_retracted", False):
            return False
        free = self.loop.pools.req_to_token_pool.free_slots
        free = free.tolist() if hasattr(free, "tolist") else free
        return req in self.loop.waiting_queue and int(pool_idx) in free

    def _sessions(self, held: dict[str, list[Holding]], live_rows: set[int]) -> None:
        for sid, slot in cache_views.session_records(self.loop.tree_cache).items():
            kv = cache_views.kv(slot)
            if kv.pool_idx is None or kv.pool_idx in live_rows:
                continue  # a slot a live turn borrows counts once, as the request's
            self._row_holder(held, "session", f"session {sid} SessionSlot row", kv, None)
            if kv.mamba is not None:
                who = f"session {sid} SessionSlot mamba slot {kv.mamba}"
                held[MAMBA].append(Holding(owner="session", who=who, units=(kv.mamba,)))

    def _row_holder(self, held, owner: str, tag: str, kv: cache_views.KvView, rid) -> None:
        who = (
            f"{tag} {kv.pool_idx} (kv_committed_len {kv.committed}, "
            f"kv_allocated_len {kv.allocated})"
        )
        units = self.units(self.row(kv.pool_idx, 0, kv.allocated))
        held[KV].append(Holding(owner=owner, who=who, units=units, rid=rid))
        if self.swa:
            swa = self.swa_units(kv.pool_idx, kv.swa_evicted, kv.allocated)
            held[SWA].append(
                Holding(owner=owner, who=f"{who} swa from {kv.swa_evicted}", units=swa, rid=rid)
            )
