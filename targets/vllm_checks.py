"""White-box checks of a live vLLM scheduler that its block pool's own bookkeeping cannot see.

``vllm_audit.py`` checks that ref counts, the free queue, the prefix map and
the block tables agree with each other. These check them against what they
describe, and against time:

hashes and tokens (``check_hashes``, ``HashLedger``)
    A prefix hash names the tokens whose KV a block holds. Each request's
    ``block_hashes`` are recomputed from its tokens with the request's own
    hasher (so cache salt, LoRA and multimodal keys count as vLLM counts
    them), and compared with what the request and its cached blocks carry:

    ``request-hash-stale``   ``block_hashes[i]`` is not the hash its tokens make
                             (the first such index), or there are more hashes
                             than the tokens make
    ``block-hash-vs-tokens`` a cached block in a live request's table carries
                             another hash than that request's tokens make there:
                             the prefix map files this KV under other tokens
    ``block-beyond-tokens``  a cached (full) block lies past the request's tokens
    ``shared-block-tokens``  two live requests hold one cached block with
                             different token prefixes up to its end
    ``hit-on-other-tokens``  (across probes) a block is held under one hash by a
                             request whose prefix differs from its first holder's:
                             a prefix hit that reads KV computed for other tokens

per-step scratch (``check_scratch``, ``registries``)
    Every list, set, deque and dict the ``KVCacheManager``, its coordinator
    and each group's manager keep, by attribute path:

    ``scratch-not-drained``  with no live request, one of block ids or blocks is
                             not empty (state meant for one step kept past it)
    ``scratch-over-pool``    one holds more entries than the pool has blocks
    ``dead-request-key``     a dict keyed by request ids keeps ids the scheduler
                             no longer knows and that hold no blocks (a request
                             that still holds blocks is the audit's
                             ``orphan-holder``, ``req_to_blocks`` too)

    ``registries`` gives their sizes, which the gate compares before and
    after a run (the quiescence detector).

liveness (``LivenessTracker``: ``before`` and ``after`` each ``schedule()``)
    ``running-skipped``      a running request that holds blocks and has work
                             left was neither scheduled nor preempted by a step
                             that left token budget, and no request that could
                             not get blocks (preempted, after every scheduled
                             one) ended the walk before it
    ``running-starved``      the same for more than ``bound`` steps in a row,
                             without the reasoning about order

    Known blind spots: a step may skip a request for reasons these objects do
    not show (a multimodal encoder budget, Mamba's block-aligned splits); the
    engine says which requests it held back itself through ``deferred``.

Everything here only reads and imports nothing from vLLM (duck-typed, as
``vllm_audit.py``), so it runs in vLLM's engine core between two steps, or in
the in-process driver (``vllm_sched_driver.py``) after each ``schedule()``.
Each finding is a ``vllm_audit.Violation``; ``vllm_audit.KINDS`` maps each
rule to the finding kind whose detector owns it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator

from kvwatch.targets.vllm_audit import (
    BLOCK_BEYOND_TOKENS,
    BLOCK_HASH_VS_TOKENS,
    DEAD_REQUEST_KEY,
    HIT_ON_OTHER_TOKENS,
    REQUEST_HASH_STALE,
    RUNNING_SKIPPED,
    RUNNING_STARVED,
    SCRATCH_NOT_DRAINED,
    SCRATCH_OVER_POOL,
    SHARED_BLOCK_TOKENS,
    Violation,
    short_hash,
)

AUDITED = frozenset({"req_to_blocks"})  # per-request tables vllm_audit already judges
NAMED = 20  # ids kept in one finding


# -- the objects ----------------------------------------------------------------------------
def group_managers(scheduler) -> list[tuple[int, object]]:
    """(group id, single-type manager) of each KV cache group."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return [(getattr(m, "kv_cache_group_id", i), m) for i, m in enumerate(managers)]


def pool_index(scheduler) -> dict[int, int]:
    """id(block pool) -> its number, in the order groups use them (as the audit numbers them)."""
    out: dict[int, int] = {}
    for _, manager in group_managers(scheduler):
        out.setdefault(id(manager.block_pool), len(out))
    return out


def hash_block_size(scheduler) -> int | None:
    """Tokens per hash: the scheduler's, its manager's or its coordinator's."""
    kv = scheduler.kv_cache_manager
    for holder in (scheduler, kv, getattr(kv, "coordinator", None)):
        size = getattr(holder, "hash_block_size", None)
        if isinstance(size, int) and size > 0:
            return size
    return None


def raw_hash(key):
    """A block's key without its group: vLLM appends 4 bytes of group id to the hash."""
    if isinstance(key, bytes) and len(key) > 4:
        return key[:-4]
    return getattr(key, "block_hash", key)


def hex_of(block_hash) -> str | None:
    """A request's block hash (no group id) in short form."""
    if block_hash is None:
        return None
    return block_hash[:6].hex() if isinstance(block_hash, bytes) else repr(block_hash)[:16]


class _Unhashed:
    """A request seen with no block hashes yet: its own hasher, called on this,
    computes the whole chain from token 0."""

    def __init__(self, request) -> None:
        object.__setattr__(self, "_request", request)
        object.__setattr__(self, "block_hashes", [])

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_request"), name)


def recomputed_hashes(request) -> list | None:
    """The block hashes ``request``'s tokens make, or None without a hasher (no prefix caching)."""
    hasher = getattr(request, "_block_hasher", None)
    return None if hasher is None else list(hasher(_Unhashed(request)))


def prefix_digests(tokens: list[int], size: int) -> list[str]:
    """A digest of ``tokens[: (i + 1) * size]`` for each full block i, chained (linear time)."""
    out, last = [], b""
    for end in range(size, len(tokens) + 1, size):
        last = hashlib.blake2b(last + repr(tokens[end - size : end]).encode(), digest_size=10)
        last = last.digest()
        out.append(last.hex())
    return out


def table(manager, request_id: str) -> list:
    """The blocks ``manager`` holds for ``request_id`` (none when it holds nothing)."""
    blocks = manager.req_to_blocks
    return list(blocks.get(request_id, ())) if hasattr(blocks, "get") else []


def cached_blocks(block_list) -> Iterator[tuple[int, object]]:
    """(index, block) of the blocks that carry a hash (cached, full), null slots left out."""
    for i, block in enumerate(block_list):
        if not getattr(block, "is_null", False) and block.block_hash is not None:
            yield i, block


# -- hashes and tokens ----------------------------------------------------------------------
def check_hashes(scheduler) -> list[Violation]:
    """``request-hash-stale``, ``block-hash-vs-tokens``, ``block-beyond-tokens`` and
    ``shared-block-tokens`` over the scheduler's live requests."""
    found: list[Violation] = []
    holders: dict[tuple[int, int], tuple[str, int, str]] = {}
    pools = pool_index(scheduler)
    for request_id, request in sorted(scheduler.requests.items()):
        fresh = recomputed_hashes(request)
        if fresh is None:
            continue
        found += _chain(request_id, request, fresh)
        tokens = list(request.all_token_ids)
        for group, manager in group_managers(scheduler):
            blocks = table(manager, request_id)
            scale = max(1, manager.block_size // (hash_block_size(scheduler) or manager.block_size))
            digests = prefix_digests(tokens, manager.block_size)
            where = _Where(request_id, group, pools[id(manager.block_pool)])
            for i, block in cached_blocks(blocks):
                found += where.block(i, block, fresh, (i + 1) * scale - 1, digests, holders)
    return found


def _chain(request_id: str, request, fresh: list) -> list[Violation]:
    """The request's own chain against the recomputed one: the first index that differs."""
    have = list(getattr(request, "block_hashes", ()))
    for i, (carried, made) in enumerate(zip(have, fresh, strict=False)):
        if carried != made:
            detail = (
                f"request {request_id}: block_hashes[{i}] is {hex_of(carried)} but its tokens "
                f"hash to {hex_of(made)} ({len(have)} hashes, {len(fresh)} recomputed, "
                f"{request.num_tokens} tokens)"
            )
            subject = f"request {request_id} block_hashes[{i}]"
            return [
                _found(
                    REQUEST_HASH_STALE, detail, requests=(request_id,), key=carried, subject=subject
                )
            ]
    if len(have) > len(fresh):
        detail = f"request {request_id} has {len(have)} block hashes, its tokens make {len(fresh)}"
        subject = f"request {request_id} hashes past its tokens"
        return [_found(REQUEST_HASH_STALE, detail, requests=(request_id,), subject=subject)]
    return []


def _found(
    rule, detail, *, blocks=(), requests=(), key=None, pool=0, hashed=False, subject=""
) -> Violation:
    """A finding; ``key`` is a block's key (``hashed``: with its group id) or a request's
    hash; ``subject`` what it is about, where its detail carries counts that move."""
    shown = short_hash(key) if hashed else hex_of(key)
    return Violation(
        rule=rule,
        detail=detail,
        blocks=tuple(blocks),
        requests=tuple(requests),
        hash=shown,
        pool=pool,
        subject=subject,
    )


class _Where:
    """One request's table in one group: each of its cached blocks checked in turn."""

    def __init__(self, request_id: str, group: int, pool: int) -> None:
        self.request_id, self.group, self.pool = request_id, group, pool

    def block(self, i, block, fresh, j, digests, holders) -> list[Violation]:
        """Block ``i`` against hash ``fresh[j]`` and the prefix digest of its end."""
        rid, at = self.request_id, f"request {self.request_id} group {self.group}"
        ids, key = (block.block_id,), block.block_hash
        if j >= len(fresh) or i >= len(digests):
            detail = f"{at}: block {block.block_id} at index {i} is cached (full) past its tokens"
            return [self._found(BLOCK_BEYOND_TOKENS, detail, ids, (rid,), key)]
        subject = f"request {rid} block {block.block_id}"
        out = []
        if raw_hash(key) != fresh[j]:
            detail = (
                f"{at}: block {block.block_id} at index {i} carries {short_hash(key)}, its tokens "
                f"hash to {hex_of(fresh[j])}: the prefix map files this KV under other tokens"
            )
            out.append(self._found(BLOCK_HASH_VS_TOKENS, detail, ids, (rid,), key, subject))
        mine = (rid, i, digests[i])
        other = holders.setdefault((self.pool, block.block_id), mine)
        if other is not mine and (other[1], other[2]) != (i, mine[2]):
            detail = (
                f"block {block.block_id} (group {self.group}) is held by {other[0]} at index "
                f"{other[1]} and by {rid} at index {i}, with different token prefixes"
            )
            subject = f"block {block.block_id} held by {other[0]} and {rid}"
            out.append(self._found(SHARED_BLOCK_TOKENS, detail, ids, (other[0], rid), key, subject))
        return out

    def _found(self, rule, detail, blocks, requests, key, subject="") -> Violation:
        """A finding on this request's block (its subject: the request and the block)."""
        subject = subject or f"request {self.request_id} block {blocks[0]}"
        return _found(
            rule,
            detail,
            blocks=blocks,
            requests=requests,
            key=key,
            pool=self.pool,
            hashed=True,
            subject=subject,
        )


class HashLedger:
    """Across probes: the token prefix each (pool, block, hash) was first seen
    holding. A later holder of that block under that hash must hold the same
    prefix (``hit-on-other-tokens``). Entries go when the block's hash changes
    (it was evicted), so the ledger never outgrows the pools."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int, object], tuple[str, str]] = {}
        self.reported: set[tuple] = set()

    def observe(self, scheduler) -> list[Violation]:
        found: list[Violation] = []
        pools = pool_index(scheduler)
        for group, manager in group_managers(scheduler):
            pool = pools[id(manager.block_pool)]
            for request_id, request in sorted(scheduler.requests.items()):
                blocks = table(manager, request_id)
                digests = prefix_digests(list(request.all_token_ids), manager.block_size)
                for i, block in cached_blocks(blocks):
                    if i < len(digests):
                        found += self._holder(group, pool, request_id, i, block, digests[i])
        self._forget(scheduler, pools)
        return found

    def _holder(self, group, pool, request_id, i, block, digest) -> list[Violation]:
        key = (pool, block.block_id, block.block_hash)
        first = self.seen.setdefault(key, (request_id, digest))
        if first[1] == digest or (key, request_id) in self.reported:
            return []
        self.reported.add((key, request_id))
        detail = (
            f"block {block.block_id} (group {group}) under hash {short_hash(block.block_hash)} "
            f"was first held by {first[0]} with another token prefix; {request_id} holds it at "
            f"index {i}: its KV was computed for other tokens"
        )
        return [
            _found(
                HIT_ON_OTHER_TOKENS,
                detail,
                blocks=(block.block_id,),
                requests=(first[0], request_id),
                key=block.block_hash,
                pool=pool,
                hashed=True,
                subject=f"block {block.block_id} read by {request_id}",
            )
        ]

    def _forget(self, scheduler, pools: dict[int, int]) -> None:
        by_number = {pools[id(m.block_pool)]: m.block_pool for _, m in group_managers(scheduler)}
        for key in list(self.seen):
            number, block_id, block_hash = key
            blocks = by_number[number].blocks if number in by_number else []
            if not (0 <= block_id < len(blocks) and blocks[block_id].block_hash == block_hash):
                del self.seen[key]
        self.reported = {r for r in self.reported if r[0] in self.seen}


# -- per-step scratch -----------------------------------------------------------------------
def owners(scheduler) -> list[tuple[str, object]]:
    """The objects whose containers are checked, by the path that names them."""
    kv = scheduler.kv_cache_manager
    out = [("kv_cache_manager", kv), ("kv_cache_manager.coordinator", kv.coordinator)]
    managers = kv.coordinator.single_type_managers
    out += [(f"kv_cache_manager.coordinator.managers[{i}]", m) for i, m in enumerate(managers)]
    return out


def containers(obj) -> Iterator[tuple[str, object]]:
    """(attribute, value) of each list, set, deque and dict ``obj`` keeps."""
    for name, value in vars(obj).items():
        if isinstance(value, list | set | frozenset | dict) or type(value).__name__ == "deque":
            yield name, value


def registries(scheduler) -> dict[str, int]:
    """The length of every container ``owners`` keep, by attribute path."""
    return {
        f"{path}.{name}": len(value)
        for path, obj in owners(scheduler)
        for name, value in containers(obj)
    }


def _is_block(item) -> bool:
    return (isinstance(item, int) and not isinstance(item, bool)) or hasattr(item, "block_id")


def _block_entries(items: list) -> tuple[int, ...] | None:
    """The block ids of a container of block ids, blocks, or tuples of blocks (pending
    copy pairs); None for any other container (config tuples, specs, group ids)."""
    pairs = all(
        isinstance(x, tuple) and x and all(hasattr(y, "block_id") for y in x) for x in items
    )
    if not (pairs or all(_is_block(x) for x in items)):
        return None
    flat = [y for x in items for y in (x if isinstance(x, tuple) else (x,))]
    return tuple(x if isinstance(x, int) else x.block_id for x in flat)


def check_scratch(scheduler, live: Iterable[str] | None = None) -> list[Violation]:
    """``scratch-not-drained``, ``scratch-over-pool`` and ``dead-request-key`` over the
    containers ``owners`` keep; ``live`` defaults to the scheduler's requests."""
    live = set(scheduler.requests if live is None else live)
    holding = {rid for _, m in group_managers(scheduler) for rid in m.req_to_blocks}
    size = len(scheduler.kv_cache_manager.block_pool.blocks)
    found: list[Violation] = []
    for path, obj in owners(scheduler):
        pool = getattr(obj, "block_pool", None)
        bound = len(pool.blocks) if pool is not None else size
        for name, value in containers(obj):
            where = f"{path}.{name}"
            if isinstance(value, dict):
                found += [] if name in AUDITED else _dead_keys(where, value, live | holding)
            elif value and (ids := _block_entries(list(value))) is not None:
                found += _scratch(where, len(value), ids, bound, idle=not live)
    return found


def _dead_keys(where: str, value: dict, live: set[str]) -> list[Violation]:
    keys = [k for k in value if isinstance(k, str)]
    dead = sorted(k for k in keys if k not in live)
    if not dead or len(keys) != len(value):
        return []
    detail = (
        f"{where} keeps {len(dead)} request ids the scheduler no longer knows (of {len(value)})"
    )
    return [_found(DEAD_REQUEST_KEY, detail, requests=dead[:NAMED])]


def _scratch(where: str, n: int, ids: tuple[int, ...], bound: int, idle: bool) -> list[Violation]:
    out = []
    if n > bound:
        detail = (
            f"{where} holds {n} entries, more than the pool's {bound} blocks "
            f"({len(set(ids))} distinct)"
        )
        out.append(_found(SCRATCH_OVER_POOL, detail, blocks=ids[:NAMED]))
    if idle:
        detail = f"{where} holds {n} entries with no live request"
        out.append(_found(SCRATCH_NOT_DRAINED, detail, blocks=ids[:NAMED]))
    return out


# -- liveness -------------------------------------------------------------------------------
def holds_blocks(scheduler, request_id: str) -> bool:
    return any(
        not getattr(block, "is_null", False)
        for _, manager in group_managers(scheduler)
        for block in table(manager, request_id)
    )


def work_left(request) -> int:
    """Tokens the running loop could still schedule for ``request``, less a step in
    flight that could only produce past ``max_tokens`` (async scheduling's last one)."""
    placeholders = getattr(request, "num_output_placeholders", 0) or 0
    pending = request.num_tokens_with_spec + placeholders - request.num_computed_tokens
    limit = getattr(request, "max_tokens", None)
    last = request.num_computed_tokens + 2 - placeholders
    if placeholders and limit is not None and last >= request.num_prompt_tokens + limit:
        return 0
    return max(0, pending)


def _preempted(scheduler, out, order: list[str]) -> set[str]:
    """Who this step preempted: the output says so, or the request's status does."""
    named = set(getattr(out, "preempted_req_ids", None) or ())
    for request_id in order:
        request = scheduler.requests.get(request_id)
        status = getattr(getattr(request, "status", None), "name", "")
        if "PREEMPT" in str(status):
            named.add(request_id)
    return named


class LivenessTracker:
    """``before(scheduler)`` right before ``schedule()``, ``after(scheduler, output,
    deferred)`` right after it. ``deferred(request) -> bool`` names requests the
    engine itself asked the scheduler to hold back this step (data-parallel
    prefill throttling holds back prefill chunks)."""

    def __init__(self, bound: int = 2) -> None:
        self.bound = bound
        self.missed: dict[str, int] = {}
        self.order: list[str] = []
        self.pending: dict[str, int] = {}
        self.holding: set[str] = set()

    def before(self, scheduler) -> None:
        self.order = [r.request_id for r in scheduler.running]
        self.pending = {r.request_id: work_left(r) for r in scheduler.running}
        self.holding = {rid for rid in self.order if holds_blocks(scheduler, rid)}

    def after(self, scheduler, out, deferred: Callable | None = None) -> list[Violation]:
        scheduled = set(out.num_scheduled_tokens)
        preempted = _preempted(scheduler, out, self.order)
        running = {r.request_id for r in scheduler.running}
        used = getattr(out, "total_num_scheduled_tokens", sum(out.num_scheduled_tokens.values()))
        budget = getattr(scheduler, "max_num_scheduled_tokens", None)
        spare = None if budget is None else budget - used
        found: list[Violation] = []
        for rid in self.order:
            passed_over = rid in running and rid not in scheduled and rid not in preempted
            if passed_over and self._could_run(scheduler, rid, deferred) and spare:
                found += self._missed(rid, scheduled, preempted, spare)
            else:
                self.missed.pop(rid, None)
        self.missed = {rid: n for rid, n in self.missed.items() if rid in scheduler.requests}
        return found

    def _could_run(self, scheduler, rid: str, deferred: Callable | None) -> bool:
        held_back = deferred is not None and deferred(scheduler.requests[rid])
        return self.pending.get(rid, 0) > 0 and rid in self.holding and not held_back

    def _missed(self, rid: str, scheduled: set, preempted: set, spare: int) -> list[Violation]:
        """``rid`` was passed over. The walk visits running requests in order and stops
        early only when the budget is spent or a request that could not get blocks
        preempted itself: a preempted request after every scheduled one, before ``rid``."""
        self.missed[rid] = self.missed.get(rid, 0) + 1
        pos = {r: i for i, r in enumerate(self.order)}
        last = max((pos[r] for r in scheduled if r in pos), default=-1)
        out = []
        if not any(last < pos.get(p, -1) < pos[rid] for p in preempted):
            later = [r for r in self.order[pos[rid] + 1 :] if r in scheduled]
            detail = (
                f"request {rid} (running, {self.pending[rid]} tokens to compute, holds blocks) "
                f"was not scheduled although {spare} tokens of budget were left and "
                f"{len(later)} request(s) after it were ({', '.join(later[:3])}); "
                f"preempted this step: {', '.join(sorted(preempted)) or 'none'}"
            )
            out.append(_found(RUNNING_SKIPPED, detail, requests=(rid,)))
        if self.missed[rid] > self.bound:
            detail = (
                f"request {rid} holds blocks and has work left but was neither scheduled nor "
                f"preempted for {self.missed[rid]} steps in a row with budget to spare"
            )
            out.append(_found(RUNNING_STARVED, detail, requests=(rid,)))
        return out
