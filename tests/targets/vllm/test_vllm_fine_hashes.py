"""The hash checks (``targets/vllm/checks.py``) with prefix hashes finer than blocks, as
vLLM keeps them when ``hash_block_size`` < a group's block size: a request's hashes one
per ``UNIT`` tokens, a block's ``block_hash`` covering ``block_hash_num_tokens`` of its
request's prefix (a partial entry ends inside the block), further keys filed beside it in
``cached_block_hashes_by_block``. Plain objects with vLLM's shapes: no vLLM here."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

from kvwatch.targets.vllm import checks as checks

UNIT, BLOCK = 4, 8  # tokens per hash, tokens per block


def chain(tokens: list[int]) -> list[bytes]:
    out, parent = [], b"root"
    for end in range(UNIT, len(tokens) + 1, UNIT):
        parent = hashlib.sha256(parent + repr(tokens[end - UNIT : end]).encode()).digest()
        out.append(parent)
    return out


def key(block_hash: bytes) -> bytes:
    return block_hash + (0).to_bytes(4, "big")


class Request(SimpleNamespace):
    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


def request(rid: str, tokens: list[int]) -> Request:
    hasher = lambda r: chain(list(r.all_token_ids))[len(r.block_hashes) :]  # noqa: E731
    r = Request(request_id=rid, all_token_ids=list(tokens), block_hashes=[], _block_hasher=hasher)
    r.block_hashes = chain(tokens)
    return r


class Fine:
    """One full-attention group of ``BLOCK``-token blocks hashed every ``UNIT`` tokens."""

    def __init__(self, n: int = 12) -> None:
        blocks = [
            SimpleNamespace(block_id=i, block_hash=None, block_hash_num_tokens=None, is_null=i == 0)
            for i in range(n)
        ]
        self.pool = SimpleNamespace(blocks=blocks, cached_block_hashes_by_block={})
        self.manager = SimpleNamespace(
            block_size=BLOCK, block_pool=self.pool, req_to_blocks={}, kv_cache_group_id=0
        )
        coordinator = SimpleNamespace(single_type_managers=[self.manager])
        kv = SimpleNamespace(coordinator=coordinator, block_pool=self.pool)
        self.scheduler = SimpleNamespace(requests={}, kv_cache_manager=kv, hash_block_size=UNIT)

    def hold(self, r: Request, ids: list[int]) -> None:
        """``r`` holds blocks ``ids``; each full block carries its end's hash, and a last
        block its tokens end inside carries a partial entry at the last hash boundary."""
        for i, block_id in enumerate(ids):
            block = self.pool.blocks[block_id]
            end = min((i + 1) * BLOCK, len(r.block_hashes) * UNIT)
            if end > i * BLOCK and block.block_hash is None:
                block.block_hash = key(r.block_hashes[end // UNIT - 1])
                block.block_hash_num_tokens = end
        self.manager.req_to_blocks[r.request_id] = [self.pool.blocks[i] for i in ids]
        self.scheduler.requests[r.request_id] = r


def rules(found) -> list[str]:
    return [f.rule for f in found]


def test_full_blocks_and_a_partial_tail_agree_with_the_tokens_at_their_boundaries():
    fine = Fine()
    a = request("A", list(range(13)))  # hashes at 4, 8, 12: block 1's ends at 12, inside it
    fine.hold(a, [1, 2])
    assert fine.pool.blocks[2].block_hash_num_tokens == 12
    fine.pool.cached_block_hashes_by_block[1] = {key(a.block_hashes[0])}  # an inner boundary
    assert checks.check_hashes(fine.scheduler) == []
    ledger = checks.HashLedger()
    assert ledger.observe(fine.scheduler) == [] and ledger.observe(fine.scheduler) == []


def test_two_requests_that_agree_up_to_a_partial_entry_share_its_block():
    """B hit A's partial entry at 12 tokens: their tokens differ after it, inside the
    block, which is what a partial entry promises nothing about."""
    fine = Fine()
    a = request("A", list(range(13)))
    b = request("B", [*range(12), 99, 98])
    fine.hold(a, [1, 2])
    fine.hold(b, [1, 2])
    assert checks.check_hashes(fine.scheduler) == []
    assert checks.HashLedger().observe(fine.scheduler) == []


def test_a_partial_entry_that_claims_fewer_tokens_than_its_hash_covers_is_caught():
    fine = Fine()
    a = request("A", list(range(13)))
    fine.hold(a, [1, 2])
    fine.pool.blocks[2].block_hash_num_tokens = 8 + UNIT // 2  # off the hash unit
    found = checks.check_hashes(fine.scheduler)
    assert rules(found) == ["partial-hash-span"] and found[0].blocks == (2,)
    assert "not a 4-token boundary inside tokens 8..16" in found[0].detail
    fine.pool.blocks[2].block_hash_num_tokens = 16  # past A's 13 tokens (hashes to 12)
    assert rules(checks.check_hashes(fine.scheduler)) == ["block-beyond-tokens"]
    fine.pool.blocks[2].block_hash_num_tokens = 4  # outside block 1 altogether
    assert rules(checks.check_hashes(fine.scheduler)) == ["partial-hash-span"]


def test_a_key_that_is_not_the_hash_at_the_boundary_it_covers_is_caught():
    fine = Fine()
    a = request("A", list(range(13)))
    fine.hold(a, [1, 2])
    fine.pool.blocks[2].block_hash = key(a.block_hashes[1])  # the hash at 8, said to cover 12
    found = checks.check_hashes(fine.scheduler)
    assert rules(found) == ["block-hash-vs-tokens"] and found[0].blocks == (2,)


def test_a_foreign_key_filed_beside_a_blocks_own_is_caught_as_a_partial_entry():
    fine = Fine()
    a = request("A", list(range(13)))
    fine.hold(a, [1, 2])
    fine.pool.cached_block_hashes_by_block[2] = {key(b"\x07" * 32)}
    found = checks.check_hashes(fine.scheduler)
    assert rules(found) == ["block-hash-vs-tokens"] and "(a partial entry)" in found[0].detail
    fine.pool.cached_block_hashes_by_block[2] = {key(a.block_hashes[0])}  # block 0's boundary
    assert rules(checks.check_hashes(fine.scheduler)) == ["block-hash-vs-tokens"]


def test_requests_that_differ_before_a_shared_blocks_boundary_are_caught():
    fine = Fine()
    a = request("A", list(range(13)))
    b = request("B", [*range(9), 77, 78, 79, 80])  # differs at token 9, before 12
    fine.hold(a, [1, 2])
    b.block_hashes = list(a.block_hashes)  # handed A's hashes: a hit on other tokens
    fine.hold(b, [1, 2])
    ledger = checks.HashLedger()
    ledger.observe(SimpleNamespace(**{**vars(fine.scheduler), "requests": {"A": a}}))
    found = checks.check_hashes(fine.scheduler)
    assert "shared-block-tokens" in rules(found) and "request-hash-stale" in rules(found)
    assert rules(ledger.observe(fine.scheduler)) == ["hit-on-other-tokens"]


def test_without_a_finer_unit_a_block_is_checked_at_its_end_as_before():
    fine = Fine()
    fine.scheduler.hash_block_size = BLOCK  # one hash per block: the unit is the block
    a = request("A", list(range(17)))
    a.block_hashes = chain(a.all_token_ids)[1::2]  # the hashes at 8 and 16 only
    a._block_hasher = lambda r: chain(list(r.all_token_ids))[1::2][len(r.block_hashes) :]
    for i, block_id in enumerate((1, 2)):
        fine.pool.blocks[block_id].block_hash = key(a.block_hashes[i])
        fine.pool.blocks[block_id].block_hash_num_tokens = None  # older releases keep none
    fine.manager.req_to_blocks["A"] = [fine.pool.blocks[1], fine.pool.blocks[2]]
    fine.scheduler.requests["A"] = a
    assert checks.check_hashes(fine.scheduler) == []
    assert checks.unit_of(fine.scheduler, fine.manager) == BLOCK
