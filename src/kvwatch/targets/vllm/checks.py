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

per-step scratch (``check_scratch``, ``registries``: ``vllm_scratch.py``)
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

liveness (``LivenessTracker``, ``vllm_liveness.py``: ``before`` and ``after`` each
``schedule()``)
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
from collections.abc import Iterator

from kvwatch.targets.vllm.manager_audit import (
    BLOCK_BEYOND_TOKENS,
    BLOCK_HASH_VS_TOKENS,
    HIT_ON_OTHER_TOKENS,
    REQUEST_HASH_STALE,
    SHARED_BLOCK_TOKENS,
    Violation,
    short_hash,
)

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
                violation(
                    REQUEST_HASH_STALE, detail, requests=(request_id,), key=carried, subject=subject
                )
            ]
    if len(have) > len(fresh):
        detail = f"request {request_id} has {len(have)} block hashes, its tokens make {len(fresh)}"
        subject = f"request {request_id} hashes past its tokens"
        return [violation(REQUEST_HASH_STALE, detail, requests=(request_id,), subject=subject)]
    return []


def violation(
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
            return [self.violation(BLOCK_BEYOND_TOKENS, detail, ids, (rid,), key)]
        subject = f"request {rid} block {block.block_id}"
        out = []
        if raw_hash(key) != fresh[j]:
            detail = (
                f"{at}: block {block.block_id} at index {i} carries {short_hash(key)}, its tokens "
                f"hash to {hex_of(fresh[j])}: the prefix map files this KV under other tokens"
            )
            out.append(self.violation(BLOCK_HASH_VS_TOKENS, detail, ids, (rid,), key, subject))
        mine = (rid, i, digests[i])
        other = holders.setdefault((self.pool, block.block_id), mine)
        if other is not mine and (other[1], other[2]) != (i, mine[2]):
            detail = (
                f"block {block.block_id} (group {self.group}) is held by {other[0]} at index "
                f"{other[1]} and by {rid} at index {i}, with different token prefixes"
            )
            subject = f"block {block.block_id} held by {other[0]} and {rid}"
            out.append(
                self.violation(SHARED_BLOCK_TOKENS, detail, ids, (other[0], rid), key, subject)
            )
        return out

    def violation(self, rule, detail, blocks, requests, key, subject="") -> Violation:
        """A finding on this request's block (its subject: the request and the block)."""
        subject = subject or f"request {self.request_id} block {blocks[0]}"
        return violation(
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
            violation(
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
