"""``manager_audit.audit`` (``kvwatch.targets.vllm.manager_audit``) on a real vLLM ``KVCacheManager``, clean and with planted bugs.

No model and no engine: one full-attention group of 64 blocks of 16 tokens,
driven through the calls vLLM's scheduler makes for each request
(``get_computed_blocks``, ``allocate_slots`` for the prefill and for each
decoded token, ``free``), with vLLM's own block hasher so prefix hits are
real. Run it with vLLM's Python; it prints one JSON object, a key per scenario::

    python -P tests/targets/vllm/planted/manager_audit.py

``clean``     A and B share a 32-token prefix; A finishes and is freed, B runs.
``leaked``    the same, but A's free is skipped: A is neither freed nor live.
``refcount``  after ``clean``, a prefix block is touched with no holder.
``stale``     A's cached blocks are freed; a missing eviction lets a big
              request D reuse one while the prefix map still points at it.
``deferred``  A's blocks wait in the scheduler's ``deferred_frees``.
``sliding``   a 32-token sliding window: S's early blocks become null slots;
              T hits S's prompt, padded with null blocks; S finishes.
"""

from __future__ import annotations

import json
from collections import deque
from types import SimpleNamespace

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    init_none_hash,
    make_block_hash_with_group_id,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

from kvwatch.targets.vllm.manager_audit import audit, audit_scheduler, short_hash

BLOCK, NUM_BLOCKS = 16, 64
PREFIX = list(range(1000, 1032))  # two full blocks shared by A and B
init_none_hash(sha256_cbor)
HASHER = get_request_block_hasher(BLOCK, sha256_cbor)


def new_manager(window: int | None = None) -> KVCacheManager:
    """One group: full attention, or a sliding window of ``window`` tokens."""
    shape = dict(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
    if window is None:
        spec = FullAttentionSpec(**shape)
    else:
        spec = SlidingWindowSpec(**shape, sliding_window=window)
    config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layers.0.attn"], spec)],
    )
    return KVCacheManager(
        config,
        max_model_len=NUM_BLOCKS * BLOCK,
        scheduler_block_size=BLOCK,
        hash_block_size=BLOCK,
        enable_caching=True,
    )


def new_request(request_id: str, prompt: list[int]) -> Request:
    params = SamplingParams(max_tokens=32)
    return Request(request_id, prompt, params, None, block_hasher=HASHER)


def admit(manager: KVCacheManager, request: Request) -> int:
    """Prefill in one step, as the scheduler does for a new request; the hit length."""
    hit_blocks, hit, _ = manager.get_computed_blocks(request)
    blocks = manager.allocate_slots(request, request.num_tokens - hit, hit, hit_blocks)
    assert blocks is not None, request.request_id
    request.num_computed_tokens = request.num_tokens
    request.status = RequestStatus.RUNNING
    return hit


def decode(manager: KVCacheManager, request: Request, steps: int) -> None:
    for step in range(steps):
        request.append_output_token_ids(5000 + step)
        assert manager.allocate_slots(request, 1) is not None
        request.num_computed_tokens += 1


def finish(manager: KVCacheManager, request: Request, free: bool = True) -> None:
    request.status = RequestStatus.FINISHED_STOPPED
    if free:
        manager.free(request)


def ids(manager: KVCacheManager, request: Request) -> list[int]:
    return manager.get_block_ids(request.request_id)[0]


def two_sharing() -> tuple[KVCacheManager, Request, Request, int]:
    """A (53 tokens, 4 blocks) then B (52 tokens) hitting A's two prefix blocks."""
    manager = new_manager()
    a = new_request("A", PREFIX + list(range(2000, 2021)))
    b = new_request("B", PREFIX + list(range(3000, 3020)))
    admit(manager, a)
    hit = admit(manager, b)
    decode(manager, a, 3)
    decode(manager, b, 14)  # fills B's fourth block (cached) and opens a fifth
    return manager, a, b, hit


def report(result, usage: float | None = None, **extra) -> dict:
    return {**result.to_dict(), **({"usage": usage} if usage is not None else {}), **extra}


def clean() -> dict:
    manager, a, b, hit = two_sharing()
    pool = manager.block_pool
    shared = ids(manager, a)[:2]
    both = audit(manager, {"A", "B"})
    refs_both = [pool.blocks[i].ref_cnt for i in shared]
    a_ids = ids(manager, a)
    finish(manager, a)
    cached_free = [i for i in a_ids if pool.blocks[i].block_hash and pool.blocks[i].ref_cnt == 0]
    return report(
        audit(manager, {"B"}),
        pool.get_usage(),
        hit=hit,
        shared=shared,
        both_live=report(both),
        refs_both_live=refs_both,
        refs_after=[pool.blocks[i].ref_cnt for i in shared],
        a_blocks=a_ids,
        b_blocks=ids(manager, b),
        cached_free=cached_free,
    )


def leaked() -> dict:
    manager, a, _, _ = two_sharing()
    control, _, _, _ = two_sharing()  # A still running: what the gauge sees then
    a_ids = ids(manager, a)
    finish(manager, a, free=False)
    return report(
        audit(manager, {"B"}),
        manager.block_pool.get_usage(),
        a_blocks=a_ids,
        usage_a_live=control.block_pool.get_usage(),
        as_if_live=report(audit(manager, {"A", "B"})),
    )


def refcount() -> dict:
    manager, a, _, _ = two_sharing()
    pool = manager.block_pool
    shared = ids(manager, a)[:2]
    finish(manager, a)
    before = pool.get_usage()
    pool.touch([pool.blocks[shared[0]]])  # a prefix hit whose holder never took it
    return report(audit(manager, {"B"}), pool.get_usage(), usage_before=before, block=shared[0])


def stale() -> dict:
    manager = new_manager()
    pool = manager.block_pool
    a = new_request("A", PREFIX + list(range(2000, 2008)))  # blocks: 2 cached, 1 partial
    admit(manager, a)
    a_ids = ids(manager, a)
    finish(manager, a)
    key = make_block_hash_with_group_id(a.block_hashes[1], 0)
    pool._maybe_evict_cached_block = lambda block: block.reset_hash()  # map entry kept
    d = new_request("D", list(range(10000, 10980)))  # 62 blocks: all free ones but one
    admit(manager, d)
    again = new_request("E", list(a.prompt_token_ids))
    hit_blocks, _, _ = manager.get_computed_blocks(again)
    return report(
        audit(manager, {"D"}),
        pool.get_usage(),
        block=a_ids[1],
        hash=short_hash(key),
        d_holds_block=a_ids[1] in ids(manager, d),
        hit_for_a_prompt=hit_blocks.get_block_ids()[0],
    )


def deferred() -> dict:
    manager, a, b, _ = two_sharing()
    a_ids = ids(manager, a)
    finish(manager, a, free=False)
    blocks = manager.pop_blocks_for_free(a)  # what Scheduler._free_request_blocks defers
    scheduler = SimpleNamespace(
        kv_cache_manager=manager, requests={"B": b}, deferred_frees=deque([(1, blocks)])
    )
    with_deferred = audit_scheduler(scheduler)
    without = audit(manager, {"B"})
    manager.block_pool.free_blocks(reversed(blocks))  # Scheduler._drain_deferred_frees
    return report(
        with_deferred,
        a_blocks=a_ids,
        b_blocks=ids(manager, b),
        without_deferred=report(without),
        drained=report(audit(manager, {"B"})),
    )


def sliding() -> dict:
    manager = new_manager(window=32)
    null = manager.block_pool.null_block
    s = new_request("S", PREFIX + list(range(4000, 4048)))  # 80 tokens, 5 blocks
    admit(manager, s)
    decode(manager, s, 2)  # blocks before the window go back to the pool as null slots
    t = new_request("T", PREFIX + list(range(4000, 4048)))
    hit = admit(manager, t)  # a hit padded with null blocks
    nulls = sum(block.is_null for block in manager.coordinator.get_blocks("S")[0])
    both = audit(manager, {"S", "T"})
    finish(manager, s)
    return report(
        audit(manager, {"T"}),
        hit=hit,
        nulls_in_s=nulls,
        t_blocks=manager.get_block_ids("T")[0],
        both_live=report(both),
        null_ref_cnt=null.ref_cnt,
    )


def main() -> None:
    scenarios = (clean, leaked, refcount, stale, deferred, sliding)
    print(json.dumps({scenario.__name__: scenario() for scenario in scenarios}))


if __name__ == "__main__":
    main()
