"""vLLM's own ``Scheduler`` built for one run of the driver, with no model.

The scheduler reads only the tiny model's config (``MODEL``, the shape of
``tinymodel.py``), written to a folder; the KV cache layout becomes vLLM's own
objects through ``kv_groups.py``. Run in vLLM's Python: vLLM is imported
inside each function, so this module imports in the gate's Python too, which
never calls it. ``request_hasher`` is vLLM's own, seeded once per process as
the engine core seeds it, so the hashes the checks recompute are the ones the
scheduler keeps.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from kvwatch.targets.vllm.kv_groups import (
    Unsupported,
    accepted,
    block_sizes,
    configure,
    kv_cache_config,
)
from kvwatch.targets.vllm.kv_layout import Layout

# the tiny model's shape (targets/vllm/tinymodel.py); the scheduler reads its config only
MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


def _options(cls, options: dict) -> dict:
    """``options`` for ``cls``; ``Unsupported`` where this release lacks one of them."""
    if missing := sorted(set(options) - set(accepted(cls, **options))):
        raise Unsupported(f"this release's {cls.__name__} has no {', '.join(missing)}")
    return dict(options)


def _configs(
    model_dir: Path,
    layout: Layout,
    policy: str,
    in_flight: int,
    budget: int,
    context: int,
    options: dict,
):
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    fields = {"scheduler": SchedulerConfig, "cache": CacheConfig}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ValueError(f"options for {unknown}: only {sorted(fields)} take options")

    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(MODEL))
    base = accepted(
        SchedulerConfig,
        max_num_seqs=16,
        max_num_batched_tokens=budget,
        max_model_len=context,
        enable_chunked_prefill=True,
        async_scheduling=in_flight > 1,
        is_encoder_decoder=False,
        policy=policy,
    )
    scheduler = SchedulerConfig(
        **{**base, **_options(SchedulerConfig, options.get("scheduler", {}))}
    )
    model = ModelConfig(
        model=str(model_dir),
        dtype="float32",
        seed=0,
        skip_tokenizer_init=True,
        max_model_len=context,
    )
    size = layout.block_size
    cached = accepted(CacheConfig, block_size=size, enable_prefix_caching=True)
    cache = CacheConfig(**{**cached, **_options(CacheConfig, options.get("cache", {}))})
    config = VllmConfig(scheduler_config=scheduler, model_config=model, cache_config=cache)
    config.cache_config.block_size = size  # the CPU platform may have changed it
    configure(config, layout)
    return config


def build(
    model_dir: Path,
    *,
    block_size: int,
    num_blocks: int,
    policy="fcfs",
    in_flight=1,
    layout: Layout | None = None,
    budget: int = 256,
    context: int = 1024,
    options: dict | None = None,
):
    """vLLM's ``Scheduler`` (``AsyncScheduler`` with two steps in flight) on a pool of
    ``num_blocks`` blocks shared by the groups of ``layout`` (one full-attention group
    of ``block_size`` tokens when None), its block and hash sizes as vLLM resolves them
    (``kv_groups.py``), at most ``budget`` tokens a step and ``context`` a request;
    ``options``: further ``{"scheduler": {...}, "cache": {...}}`` config fields a user
    sets (``Unsupported`` where the release has no such field)."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    layout = layout or Layout(block_size=block_size)
    config = _configs(model_dir, layout, policy, in_flight, budget, context, options or {})
    kv = kv_cache_config(layout, num_blocks)
    config.cache_config.num_gpu_blocks = num_blocks
    scheduler_block, hash_block = block_sizes(kv, config, layout)
    cls = Scheduler
    if in_flight > 1:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler as cls
    kwargs = {
        "vllm_config": config,
        "kv_cache_config": kv,
        "structured_output_manager": StructuredOutputManager(config),
        "block_size": scheduler_block,
        "log_stats": False,
    }
    if "hash_block_size" in inspect.signature(cls).parameters:
        kwargs["hash_block_size"] = hash_block
    return cls(**kwargs)


def request_hasher(block_size: int):
    """vLLM's request block hasher, sha256 over CBOR; ``init_none_hash`` once per
    process, as the engine core calls it (some releases seed it at random)."""
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256_cbor)
    return get_request_block_hasher(block_size, sha256_cbor)
