"""The hash checks of a live vLLM scheduler, one probe at a time (``check_hashes``).

Each live request's ``block_hashes`` against what its tokens make, and each
cached block in its tables against the request's hashes and against the other
live holders of that block: ``request-hash-stale``, ``block-hash-vs-tokens``,
``block-beyond-tokens``, ``partial-hash-span``, ``shared-block-tokens``
(``checks.py`` says what each means). A block's hash may cover a boundary
inside it when hashes are finer than blocks; prefixes are compared up to the
tokens the hash covers. Only reads, and imports nothing from vLLM.
"""

from __future__ import annotations

from kvwatch.targets.vllm.check_findings import hex_of, violation
from kvwatch.targets.vllm.manager_audit import (
    BLOCK_BEYOND_TOKENS,
    BLOCK_HASH_VS_TOKENS,
    PARTIAL_HASH_SPAN,
    REQUEST_HASH_STALE,
    SHARED_BLOCK_TOKENS,
    Violation,
    short_hash,
)
from kvwatch.targets.vllm.scheduler_reads import (
    cached_blocks,
    extra_keys,
    group_managers,
    pool_index,
    raw_hash,
    table,
)
from kvwatch.targets.vllm.token_hashes import covered, prefix_digests, recomputed_hashes, unit_of


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
