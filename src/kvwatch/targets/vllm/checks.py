"""White-box checks of a live vLLM scheduler that its block pool's own bookkeeping cannot see.

``manager_audit.py`` checks that ref counts, the free queue, the prefix map and
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
    ``block-beyond-tokens``  a cached block's hash covers more tokens than the
                             request has
    ``partial-hash-span``    a cached block's hash covers a token count that is
                             not a hash-unit boundary inside that block
    ``shared-block-tokens``  two live requests hold one cached block with
                             different token prefixes up to its end
    ``hit-on-other-tokens``  (across probes) a block is held under one hash by a
                             request whose prefix differs from its first holder's:
                             a prefix hit that reads KV computed for other tokens

    Hashes may be finer than blocks (vLLM's ``hash_block_size``, set by
    ``prefix_match_unit`` or by groups of different block sizes): the request's
    hashes are one per ``unit`` tokens, a block's ``block_hash`` covers
    ``block_hash_num_tokens`` of them (a full block its end; a partial entry
    of ``cache_partial_block`` a boundary inside it), and the other keys the
    pool files the block under (``cached_block_hashes_by_block``) must be the
    request's hashes at boundaries inside the block. Prefixes are compared up
    to the tokens the hash covers, not to the block's end.

per-step scratch (``check_scratch``, ``registries``: ``scratch.py``)
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

liveness (``LivenessTracker``, ``liveness.py``: ``before`` and ``after`` each
``schedule()``)
    ``running-skipped``      a running request that holds blocks and has work
                             left was neither scheduled nor preempted by a step
                             that left token budget, and no request that could
                             not get blocks (preempted, after every scheduled
                             one) ended the walk before it
    ``running-starved``      the same for more than ``bound`` steps in a row,
                             without the reasoning about order
    ``scheduler-stalled``    (the in-process driver) ``STALL`` steps in a row
                             scheduled nothing with nothing in flight while
                             requests had work left and no session paused for
                             input held blocks: nothing will ever move
    ``reset-refused``        (the in-process driver) a forced prefix-cache reset
                             (``reset_running_requests``) preempted the running
                             requests and still left the index standing

    Known blind spots: a step may skip a request for reasons these objects do
    not show (a multimodal encoder budget, Mamba's block-aligned splits); the
    engine says which requests it held back itself through ``deferred``.

Everything here only reads and imports nothing from vLLM (duck-typed, as
``manager_audit.py``), so it runs in vLLM's engine core between two steps, or in
the in-process driver (``scheduler_driver.py``) after each ``schedule()``.
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
    PARTIAL_HASH_SPAN,
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
def unit_of(scheduler, manager) -> int:
    """Tokens per prefix hash for ``manager``'s group: the hash block size, which divides
    the group's block size (one hash per block when they are equal)."""
    unit = hash_block_size(scheduler) or manager.block_size
    return unit if unit > 0 and manager.block_size % unit == 0 else manager.block_size


def covered(block, index: int, block_size: int) -> int:
    """Tokens of its request's prefix that ``block``'s hash covers: vLLM's
    ``block_hash_num_tokens`` (a partial-block entry covers fewer than the block's
    end), else the end of block ``index``."""
    n = getattr(block, "block_hash_num_tokens", None)
    return n if isinstance(n, int) and n > 0 else (index + 1) * block_size


def extra_keys(manager, block) -> tuple:
    """The keys ``block`` carries besides its ``block_hash`` (partial entries, moved keys)."""
    extra = getattr(manager.block_pool, "cached_block_hashes_by_block", None) or {}
    return tuple(extra.get(block.block_id, ()))


def check_hashes(scheduler) -> list[Violation]:
    """``request-hash-stale``, ``block-hash-vs-tokens``, ``block-beyond-tokens``,
    ``partial-hash-span`` and ``shared-block-tokens`` over the scheduler's live requests."""
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
            unit = unit_of(scheduler, manager)
            table_of = _Table(request_id, group, pools[id(manager.block_pool)], manager, unit)
            digests = prefix_digests(tokens, unit)
            for i, block in cached_blocks(table(manager, request_id)):
                found += table_of.block(i, block, fresh, digests, holders)
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


class _Table:
    """One request's table in one group: each of its cached blocks checked in turn.

    Block ``i`` of a group of ``block_size`` tokens whose hash covers ``n`` tokens
    (``covered``) holds the KV of tokens ``n - unit .. n - 1`` at least: ``n`` is a
    multiple of the hash unit in ``(i * block_size, (i + 1) * block_size]``, its
    ``block_hash`` is the request's hash number ``n / unit - 1``, and every other key
    it carries is one of the request's hashes at a boundary inside the block."""

    def __init__(self, request_id: str, group: int, pool: int, manager, unit: int) -> None:
        self.request_id, self.group, self.pool = request_id, group, pool
        self.manager, self.unit = manager, unit
        self.size = manager.block_size

    def block(self, i, block, fresh, digests, holders) -> list[Violation]:
        """Block ``i`` against the hashes ``fresh`` and the prefix digests of its tokens."""
        rid, at = self.request_id, f"request {self.request_id} group {self.group}"
        ids, key, n = (block.block_id,), block.block_hash, covered(block, i, self.size)
        j = n // self.unit - 1
        if n % self.unit or not i * self.size < n <= (i + 1) * self.size:
            detail = (
                f"{at}: block {block.block_id} at index {i} carries a hash of {n} tokens, "
                f"not a {self.unit}-token boundary inside tokens {i * self.size}..{(i + 1) * self.size}"
            )
            return [self.violation(PARTIAL_HASH_SPAN, detail, ids, (rid,), key)]
        if j >= len(fresh) or j >= len(digests):
            detail = (
                f"{at}: block {block.block_id} at index {i} is cached ({n} tokens) past its tokens"
            )
            return [self.violation(BLOCK_BEYOND_TOKENS, detail, ids, (rid,), key)]
        out = self._keys(i, block, fresh)
        mine = (rid, i, digests[j])
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

    def _keys(self, i, block, fresh) -> list[Violation]:
        """The block's ``block_hash`` and its other keys against the request's hashes."""
        n = covered(block, i, self.size)
        j, scale = n // self.unit - 1, self.size // self.unit
        inside = set(fresh[i * scale : j + 1])
        out = []
        for key in (block.block_hash, *extra_keys(self.manager, block)):
            primary = key is block.block_hash
            if (raw_hash(key) == fresh[j]) if primary else (raw_hash(key) in inside):
                continue
            what = f"hash to {hex_of(fresh[j])}" if primary else "make no such hash inside it"
            detail = (
                f"request {self.request_id} group {self.group}: block {block.block_id} at index "
                f"{i} carries {short_hash(key)}{'' if primary else ' (a partial entry)'}, its "
                f"tokens {what}: the prefix map files this KV under other tokens"
            )
            subject = f"request {self.request_id} block {block.block_id}"
            subject += "" if primary else f" key {short_hash(key)}"
            ids = (block.block_id,)
            out.append(
                self.violation(BLOCK_HASH_VS_TOKENS, detail, ids, (self.request_id,), key, subject)
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
                blocks, unit = table(manager, request_id), unit_of(scheduler, manager)
                digests = prefix_digests(list(request.all_token_ids), unit)
                for i, block in cached_blocks(blocks):
                    j = covered(block, i, manager.block_size) // unit - 1
                    if 0 <= j < len(digests):
                        found += self._holder(group, pool, request_id, i, block, digests[j])
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
