"""White-box audit of vLLM 0.32's KV cache manager, read at a quiescent point.

``audit(kv_cache_manager, live_request_ids)`` reads a live ``KVCacheManager``
(its block pool, free queue, prefix-hash map and every group's block tables)
and returns the broken invariants as ``Violation``s (each rule maps to a
kvwatch ``FindingKind`` in ``KINDS``, the one vocabulary detectors match on). It only reads: it changes
nothing and imports nothing from vLLM, so it runs in vLLM's own process
(the engine core) between two engine steps, when no allocation is half done.

Who may hold a reference to a block in vLLM 0.32:

- a request's block table: ``req_to_blocks[request_id]`` of each group's
  ``SingleTypeKVCacheManager``, one reference per entry (``get_new_blocks``
  or, for a prefix hit, ``BlockPool.touch`` in ``add_local_computed_blocks``);
- a pending copy-on-write pair in ``_pending_cow_copies`` (``_apply_cow``),
  one reference on the source and one on the copy, until the scheduler drains
  them in ``take_kv_cache_block_copies``;
- whatever the caller names in ``held``: the scheduler's ``deferred_frees``
  (blocks popped by ``pop_blocks_for_free`` while a step may still write
  them; ``audit_scheduler`` adds these), or blocks a KV connector pinned.

The null block (``BlockPool.null_block``, id 0) fills table slots a sliding
window or Mamba group let go (``_remove_blocks_in_range``) and pads
sliding-window prefix hits. Its ``ref_cnt`` is not maintained (``touch``
counts it, ``_remove_blocks_in_range`` does not), so it is never counted; it
is never in the free queue and never carries a hash. Blocks released with
``unpin_blocks`` are ordinary free blocks (ref 0, in the free queue).

Groups share the coordinator's ``BlockPool`` unless one has its own, which is
audited apart (``Violation.pool``). A block can carry several prefix keys: its
``block_hash`` plus those in ``cached_block_hashes_by_block`` (partial-block
entries of ``cache_partial_block`` when a group's blocks are larger than
``hash_block_size``, and keys moved by ``move_block_hashes``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from kvwatch.contracts import FindingKind

REFCOUNT = "refcount"
FREE_AND_REFERENCED = "free-and-referenced"
UNACCOUNTED = "unaccounted-block"
FREE_COUNT = "free-count"
STALE_HASH = "stale-hash-entry"
UNINDEXED_HASH = "unindexed-hash"
ORPHAN = "orphan-holder"
PENDING_COPY = "(pending copy)"
HELD = "(held)"
# the rules of checks.py: hashes against tokens, per-step scratch, liveness
REQUEST_HASH_STALE = "request-hash-stale"
BLOCK_HASH_VS_TOKENS = "block-hash-vs-tokens"
BLOCK_BEYOND_TOKENS = "block-beyond-tokens"
SHARED_BLOCK_TOKENS = "shared-block-tokens"
HIT_ON_OTHER_TOKENS = "hit-on-other-tokens"
SCRATCH_NOT_DRAINED = "scratch-not-drained"
SCRATCH_OVER_POOL = "scratch-over-pool"
DEAD_REQUEST_KEY = "dead-request-key"
RUNNING_SKIPPED = "running-skipped"
RUNNING_STARVED = "running-starved"
SCHEDULER_STALLED = "scheduler-stalled"
# a reset that preempts every running request, then leaves the prefix index standing
RESET_REFUSED = "reset-refused"
# a cached block's hash covers tokens outside the block (fine hashing: checks.py)
PARTIAL_HASH_SPAN = "partial-hash-span"
# the KV cache event stream against the pool's prefix index (event_ledger.py)
EVENT_REMOVED_UNSTORED = "event-removed-unstored"
EVENT_STORED_NOT_HELD = "event-stored-not-held"
EVENT_UNANNOUNCED = "event-unannounced"
# each rule as the finding kind whose detector owns that invariant
KINDS = {
    REFCOUNT: FindingKind.REF_MISMATCH,  # refcount
    FREE_AND_REFERENCED: FindingKind.FREE_AND_OWNED,  # allocator
    UNACCOUNTED: FindingKind.ORPHAN,  # allocator
    ORPHAN: FindingKind.ORPHAN,  # allocator
    FREE_COUNT: FindingKind.TREE,  # tree: the pool's own bookkeeping
    STALE_HASH: FindingKind.TREE,  # tree: the prefix index
    UNINDEXED_HASH: FindingKind.TREE,
    # tree: the prefix index files KV under a hash its tokens do not make
    REQUEST_HASH_STALE: FindingKind.TREE,
    BLOCK_HASH_VS_TOKENS: FindingKind.TREE,
    BLOCK_BEYOND_TOKENS: FindingKind.TREE,
    SHARED_BLOCK_TOKENS: FindingKind.TREE,
    HIT_ON_OTHER_TOKENS: FindingKind.TREE,
    PARTIAL_HASH_SPAN: FindingKind.TREE,
    # tree: the published prefix index (the events) disagrees with the index
    EVENT_STORED_NOT_HELD: FindingKind.TREE,
    EVENT_UNANNOUNCED: FindingKind.TREE,
    # refcount: the stream's per-key count of holders went below zero
    EVENT_REMOVED_UNSTORED: FindingKind.REF_MISMATCH,
    # quiescence: a container kept past its step or its request, or over its bound
    SCRATCH_NOT_DRAINED: FindingKind.REGISTRY,
    SCRATCH_OVER_POOL: FindingKind.REGISTRY,
    DEAD_REQUEST_KEY: FindingKind.REGISTRY,
    # requests: a running request passed over while it could run
    RUNNING_SKIPPED: FindingKind.STARVED,
    RUNNING_STARVED: FindingKind.STARVED,
    SCHEDULER_STALLED: FindingKind.STARVED,
    # tree: after a forced reset the prefix index must be empty; it kept every entry
    RESET_REFUSED: FindingKind.TREE,
}


@dataclass(frozen=True, kw_only=True)
class Violation:
    """One broken invariant: which rule, in words, and what it involves.

    ``blocks`` are block ids in pool number ``pool`` (0 unless groups use
    pools of their own); ``hash`` is the prefix hash in ``short_hash`` form;
    ``subject`` what the finding is about where its detail also carries counts
    that move while the broken state stays the same (the request an orphan is,
    a block's surplus references): a later probe's finding with the same rule
    and subject is the same finding. Empty: the detail says it."""

    rule: str
    detail: str
    blocks: tuple[int, ...]
    requests: tuple[str, ...] = ()
    hash: str | None = None
    pool: int = 0
    subject: str = ""


@dataclass(frozen=True, kw_only=True)
class Audit:
    """The findings and the counts they were read against, all pools summed.

    ``blocks_total`` includes the null block, so with no findings it equals
    ``blocks_free + blocks_referenced + pools`` (one null block per pool); ``cached_hashes`` counts
    prefix-map entries; ``live_requests`` the ids given as live;
    ``holding_requests`` the requests (live or not) with blocks in a table."""

    findings: tuple[Violation, ...]
    blocks_total: int
    blocks_free: int
    blocks_referenced: int
    cached_hashes: int
    live_requests: int
    holding_requests: int
    pools: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


def short_hash(key: object) -> str | None:
    """A prefix-hash key (block hash bytes + 4-byte group id) as ``hex@gN``."""
    if key is None:
        return None
    if isinstance(key, bytes) and len(key) > 4:
        return f"{key[:-4][:6].hex()}@g{int.from_bytes(key[-4:], 'big')}"
    return repr(key)


def _free_queue(pool) -> tuple[list, bool]:
    """The blocks of ``pool.free_block_queue`` head to tail, and whether the
    walk was cut (a cycle, or more links than blocks)."""
    queue, seen, out = pool.free_block_queue, set(), []
    block = queue.fake_free_list_head.next_free_block
    while block is not None and block is not queue.fake_free_list_tail:
        if id(block) in seen or len(out) > len(pool.blocks):
            return out, True
        seen.add(id(block))
        out.append(block)
        block = block.next_free_block
    return out, block is None


def hash_entries(pool) -> Iterable[tuple[bytes, object]]:
    """Every (hash key, block) pair of ``cached_block_hash_to_block``."""
    for key, value in pool.cached_block_hash_to_block._cache.items():
        yield from ((key, b) for b in (value.values() if isinstance(value, dict) else [value]))


class _PoolAudit:
    """The four invariants of one block pool and the groups that allocate from it."""

    def __init__(self, index: int, pool, managers, held, live: set[str]) -> None:
        self.index, self.pool, self.live, self.found = index, pool, live, []
        self.holders: dict[int, list[str]] = defaultdict(list)  # block id -> holders
        self.tables: dict[str, set[int]] = defaultdict(set)  # request id -> block ids
        for manager in managers:
            for request_id, blocks in manager.req_to_blocks.items():
                for block in blocks:
                    if not block.is_null:
                        self.holders[block.block_id].append(request_id)
                        self.tables[request_id].add(block.block_id)
            for pair in getattr(manager, "_pending_cow_copies", ()):
                for block in pair:
                    self.holders[block.block_id].append(PENDING_COPY)
        for block in held:
            self.holders[block.block_id].append(HELD)

    def add(self, rule: str, detail: str, blocks, requests=(), key=None, subject="") -> None:
        found = Violation(
            rule=rule,
            detail=detail,
            blocks=tuple(blocks),
            requests=tuple(requests),
            hash=short_hash(key),
            pool=self.index,
            subject=subject,
        )
        self.found.append(found)

    def held_by(self, block) -> list[str]:
        return sorted(set(self.holders.get(block.block_id, [])))

    def refcounts(self) -> None:
        """Each non-null block's ``ref_cnt`` equals its holders (table entries over
        all groups, pending copies, ``held``): ``get_new_blocks`` sets 1 and
        ``touch`` adds 1 for each entry appended to a block table; ``free_blocks``
        takes 1 for each entry ``pop_blocks_for_free`` pops or
        ``_remove_blocks_in_range`` replaces with the null block. Holders are
        counted live or not: ``holders_live`` judges who holds."""
        for block in self.pool.blocks:
            refs = self.holders.get(block.block_id, [])
            if not block.is_null and block.ref_cnt != len(refs):
                named = ", ".join(sorted(refs)) or "none"
                detail = f"block {block.block_id} has ref_cnt {block.ref_cnt} but "
                detail += f"{len(refs)} holders ({named})"
                key = block.block_hash
                surplus = f"block {block.block_id} {block.ref_cnt - len(refs):+d} references"
                self.add(REFCOUNT, detail, [block.block_id], self.held_by(block), key, surplus)

    def accounting(self) -> int:
        """The free queue links exactly the non-null blocks with ``ref_cnt`` 0, as
        many as ``num_free_blocks`` (what ``get_usage`` reads). ``BlockPool.__init__``
        takes the null block out for good; ``get_new_blocks`` pops a block and sets
        1; ``touch`` removes one at 0; ``free_blocks`` and ``unpin_blocks`` queue
        one on reaching 0. Returns the number of free blocks."""
        queue, cut = _free_queue(self.pool)
        counter = self.pool.free_block_queue.num_free_blocks
        if cut or counter != len(queue):
            why = " (walk cut: a cycle or a dangling link)" if cut else ""
            detail = f"num_free_blocks is {counter}, the free list links {len(queue)} blocks"
            self.add(FREE_COUNT, detail + why, [], subject=f"off by {counter - len(queue)}")
        free_ids = {b.block_id for b in queue}
        for block in self.pool.blocks:
            free, at = block.block_id in free_ids, f"block {block.block_id}"
            if free and (block.ref_cnt > 0 or block.is_null):
                what = "the null block" if block.is_null else f"ref_cnt {block.ref_cnt}"
                detail = f"{at} is in the free queue with {what}"
                self.add(FREE_AND_REFERENCED, detail, [block.block_id], self.held_by(block))
            elif not free and not block.is_null and block.ref_cnt <= 0:
                detail = f"{at} has ref_cnt {block.ref_cnt} and is not in the free queue"
                self.add(UNACCOUNTED, detail, [block.block_id], key=block.block_hash)
        return len(queue)

    def hashes(self) -> int:
        """Each prefix-map entry points at this pool's non-null block that carries
        the key (as ``block_hash``, or in ``cached_block_hashes_by_block`` for a
        partial-block entry), and each key a block carries is in the map for it.
        ``_insert_block_hash`` writes both sides; ``_remove_cached_block_hashes``
        (from ``_maybe_evict_cached_block`` when ``get_new_blocks`` reuses a
        cached free block) removes both. Returns the number of entries."""
        pool, extra = self.pool, self.pool.cached_block_hashes_by_block
        entries = list(hash_entries(pool))
        for key, block in entries:
            carried = block.block_hash == key or key in extra.get(block.block_id, ())
            ours = 0 <= block.block_id < len(pool.blocks) and pool.blocks[block.block_id] is block
            if block.is_null or not ours or not carried:
                has = short_hash(block.block_hash) or "no hash"
                detail = f"hash {short_hash(key)} maps to block {block.block_id}, which "
                detail += f"carries {has}: a hit on it reads another prefix's KV"
                held, what = self.held_by(block), f"{short_hash(key)} on block {block.block_id}"
                self.add(STALE_HASH, detail, [block.block_id], held, key, what)
        for block in pool.blocks:
            for key in [block.block_hash, *extra.get(block.block_id, ())]:
                if key is not None and not pool.cached_block_hash_to_block.contain(
                    key, block.block_id
                ):
                    detail = f"block {block.block_id} carries {short_hash(key)}, not in the map"
                    self.add(UNINDEXED_HASH, detail, [block.block_id], key=key)
        return len(entries)

    def holders_live(self) -> None:
        """Only live requests hold blocks: ``Scheduler._free_blocks`` frees a
        finished request and deletes it from ``Scheduler.requests`` together;
        preemption frees its blocks and keeps the request."""
        live_held = {b for rid, ids in self.tables.items() if rid in self.live for b in ids}
        for request_id, ids in sorted(self.tables.items()):
            if request_id not in self.live:
                alone = len(ids - live_held)
                detail = f"request {request_id} is not live but holds {len(ids)} blocks "
                detail += f"({alone} held by no live request)"
                self.add(ORPHAN, detail, sorted(ids), [request_id], subject=f"request {request_id}")


def audit(kv_cache_manager, live_request_ids: Iterable[str], held: Iterable = ()) -> Audit:
    """Audit a ``KVCacheManager`` against the ids of the requests the scheduler
    still holds (``Scheduler.requests``). ``held`` names further blocks that
    hold one reference each (see the module docstring). Read between steps."""
    live = set(live_request_ids)
    managers = kv_cache_manager.coordinator.single_type_managers
    pools: dict[int, tuple[object, list]] = {}
    for manager in managers:  # groups that share a pool are audited together
        pools.setdefault(id(manager.block_pool), (manager.block_pool, []))[1].append(manager)
    held_by_pool: dict[int, list] = defaultdict(list)
    for block in held:
        owner = getattr(block, "pool", None) or kv_cache_manager.block_pool
        held_by_pool[id(owner)].append(block)
    findings: list[Violation] = []
    counts = dict.fromkeys(("blocks_total", "blocks_free", "blocks_referenced"), 0)
    counts["cached_hashes"], holding = 0, set()
    for index, (key, (pool, group)) in enumerate(pools.items()):
        check = _PoolAudit(index, pool, group, held_by_pool.get(key, []), live)
        check.refcounts()
        counts["blocks_free"] += check.accounting()
        counts["cached_hashes"] += check.hashes()
        check.holders_live()
        findings += check.found
        holding |= set(check.tables)
        counts["blocks_total"] += len(pool.blocks)
        counts["blocks_referenced"] += sum(b.ref_cnt > 0 and not b.is_null for b in pool.blocks)
    return Audit(
        findings=tuple(findings),
        live_requests=len(live),
        holding_requests=len(holding),
        pools=len(pools),
        **counts,
    )


def audit_scheduler(scheduler) -> Audit:
    """``audit`` of a vLLM ``Scheduler``: its requests are the live ones, and the
    blocks of its ``deferred_frees`` (``_free_request_blocks``,
    ``_free_cow_retained_blocks``) still hold their references."""
    deferred = [b for _, blocks in getattr(scheduler, "deferred_frees", ()) for b in blocks]
    return audit(scheduler.kv_cache_manager, scheduler.requests, held=deferred)
