"""LightLLM's pools, cache and default backend, built from a checkout with its own classes.

``build(checkout, sizes)`` imports the checkout (``source_hooks.install``,
after ``cpu_torch.patch``) and constructs, with the checkout's own
constructors:

* ``radix``: ``MemoryManager`` (its ``KvCacheAllocator``), ``ReqManager``
  and the plain ``RadixCache``;
* ``linear``: ``Qwen3NextMemManager`` (with its big-page state buffers,
  ``linear_att_big_page_buffers``), ``ReqManagerForMamba``, a
  ``LinearAttCacheManager`` of small-page state buffers and the
  ``LinearAttPagedRadixCache``, as a hybrid linear-attention model
  (Qwen3-Next / Qwen3.5) gets them;
* the default backend, ``ChunkedPrefillBackend``, made with ``object.__new__``
  and the attributes its ``__init__`` would set for one GPU without overlap,
  MTP, DP or PD, registered in ``g_infer_context`` with
  ``InferenceContext.register``.

Stand-ins beyond the modules': the model config
(``LinearAttCacheConfig.load_from_args`` reads the model's ``config.json``;
here a tiny one), the model and sampler (``forward_stand_in.py``), the
router's records and IO buffer (``infer_records.py``), and the loop's idle
``time.sleep(0.02)`` (its module's ``time`` is a namespace whose ``sleep``
returns at once: the IO buffer paces the loop).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvwatch.targets.lightllm import cpu_torch, source_hooks
from kvwatch.targets.lightllm.forward_stand_in import StandInModel, cpu_backend
from kvwatch.targets.lightllm.infer_records import EOS, IOBuffer, ShmReqManager, start_args
from kvwatch.targets.stand_ins import Stub

CACHES = ("radix", "linear")
MODULES = {
    "envs": "lightllm.utils.envs_utils",
    "radix": "lightllm.server.router.dynamic_prompt.radix_cache",
    "linear": "lightllm.server.router.dynamic_prompt.linear_att_radix_cache",
    "memm": "lightllm.common.kv_cache_mem_manager.mem_manager",
    "q3n": "lightllm.common.kv_cache_mem_manager.qwen3next_mem_manager",
    "lacm": "lightllm.common.linear_att_cache_manager",
    "reqm": "lightllm.common.req_manager",
    "ib": "lightllm.server.router.model_infer.infer_batch",
    "objreq": "lightllm.server.core.objs.req",
    "hl": "lightllm.server.core.objs.token_chunck_hash_list",
    "io": "lightllm.server.core.objs.io_objs.group_req",
    "cp": "lightllm.server.router.model_infer.mode_backend.chunked_prefill.impl",
    "cs": "lightllm.server.router.model_infer.mode_backend.chunked_prefill.control_state",
}


@dataclass(frozen=True, kw_only=True)
class InferSizes:
    """One run's pools and start args (a workload's ``sizes``)."""

    cache: str  # radix or linear
    kv_tokens: int = 256
    max_reqs: int = 8
    max_seq: int = 512
    args: dict = field(default_factory=dict)  # start args over infer_records.start_args


@dataclass(kw_only=True)
class InferParts:
    """What ``build`` made; ``modules`` are the checkout's, by ``MODULES`` key."""

    cache: str
    modules: types.SimpleNamespace
    args: Any
    mem: Any
    req_manager: Any
    small: Any  # the small-page state buffers (linear), else None
    radix: Any
    backend: Any
    ctx: Any  # g_infer_context
    shm: ShmReqManager
    io: IOBuffer


def _import(checkout: Path, sizes: InferSizes) -> types.SimpleNamespace:
    os.environ["LIGHTLLM_START_ARGS"] = json.dumps(start_args(**sizes.args))
    os.environ["LIGHTLLM_UNIQUE_SERVICE_NAME_ID"] = f"kvwatch{os.getpid()}"
    os.environ.setdefault("LIGHTLLM_LOG_LEVEL", "critical")
    cpu_torch.patch()
    source_hooks.install(checkout)
    return types.SimpleNamespace(
        **{key: importlib.import_module(name) for key, name in MODULES.items()}
    )


def _linear_config(lacm: Any) -> Any:
    """A tiny hybrid model's state shapes (one linear layer, one full-attention layer)."""
    config = lacm.LinearAttCacheConfig(
        **dict.fromkeys(("tp_world_size", "full_att_all_num_kv_heads", "full_att_num_kv_heads"), 1),
        **dict.fromkeys(("global_linear_k_heads", "global_linear_v_heads"), 1),
        **dict.fromkeys(("num_linear_k_heads", "num_linear_v_heads", "linear_layer_num"), 1),
        **dict.fromkeys(("full_att_head_dim", "head_linear_k_dim", "head_linear_v_dim"), 2),
        **{"conv_kernel_size": 2, "full_attention_interval": 2, "all_layer_num": 2},
        full_att_dtype=torch.float16,
        conv_state_dtype=torch.float16,
        ssm_state_dtype=torch.float32,
    )
    lacm.LinearAttCacheConfig.load_from_args = staticmethod(lambda: config)
    return config


def _pools(m: types.SimpleNamespace, sizes: InferSizes, args: Any) -> tuple:
    """(mem manager, req manager, small-page buffers, tree cache)."""
    name = m.envs.get_unique_server_name()
    if sizes.cache == "radix":
        mem = m.memm.MemoryManager(sizes.kv_tokens, torch.float16, 1, 2, 1)
        reqs = m.reqm.ReqManager(sizes.max_reqs, sizes.max_seq, mem)
        return mem, reqs, None, m.radix.RadixCache(name, mem.size, 0, mem_manager=mem)
    config = _linear_config(m.lacm)
    mem = m.q3n.Qwen3NextMemManager(sizes.kv_tokens, torch.float16, 1, 2, 1, linear_config=config)
    reqs = m.reqm.ReqManagerForMamba(sizes.max_reqs, sizes.max_seq, mem, config)
    small = m.lacm.LinearAttCacheManager(size=args.linear_att_cache_size, linear_config=config)
    radix = m.linear.LinearAttPagedRadixCache(
        unique_name=name,
        total_token_num=mem.size,
        rank_in_node=0,
        hash_page_size=args.linear_att_hash_page_size,
        big_page_num=args.linear_att_page_block_num,
        kv_cache_mem_manager=mem,
        linear_att_small_page_buffers=small,
    )
    return mem, reqs, small, radix


def _backend(m: types.SimpleNamespace, args: Any, parts: dict, token_salt: int) -> Any:
    """``ChunkedPrefillBackend`` with the attributes its ``__init__`` sets on one GPU."""
    b = object.__new__(cpu_backend(m.cp.ChunkedPrefillBackend))
    b.args = args
    b.model = StandInModel(parts["req_manager"], parts["mem"], token_salt)
    b.radix_cache, b.shm_req_manager, b.shm_reqs_io_buffer = (
        parts["radix"],
        parts["shm"],
        parts["io"],
    )
    b.support_overlap = b.disable_chunked_prefill = False
    b.batch_max_tokens = args.batch_max_tokens
    b.is_master_in_dp = b.is_master_in_node = True
    b.is_multinode_tp = b.is_pd_mode = False
    b.node_world_size, b.node_nccl_group = 1, None
    b.node_broadcast_tensor = torch.tensor([0], dtype=torch.int32)
    b.dp_size_in_node, b.dp_rank_in_node = 1, 0
    b.eos_id = [EOS]
    b.profiler = b.multi_level_cache_module = None
    b._enable_radix_tree_timer_merge = False
    b._radix_tree_merge_counter, b._radix_tree_merge_update_delta = 0, 6000
    b.control_state_machine = m.cs.ControlState()
    b.classed_req_no_decode = b.classed_req_strict_prefill = False
    b.prefill, b.decode = b.prefill_normal, b.decode_normal
    b.prefill_mask_func = b.decode_mask_func = None
    b.extra_post_req_handle_func = b.pd_prefill_chunked_handle_func = None
    b.overlap_event_manager = Stub("overlap_event_manager")
    b.logger = logging.getLogger("kvwatch.lightllm.backend")
    b.logger.disabled = True
    return b


def build(checkout: Path, sizes: InferSizes, token_salt: int = 0) -> InferParts:
    """LightLLM's pools, cache and backend for one run, registered as its infer context;
    ``token_salt``: the stand-in model's (``forward_stand_in.next_token``)."""
    m = _import(Path(checkout), sizes)
    m.envs.get_env_start_args.cache_clear()
    m.envs.get_unique_server_name.cache_clear()
    args = m.envs.get_env_start_args()
    mem, req_manager, small, radix = _pools(m, sizes, args)
    parts = {"mem": mem, "req_manager": req_manager, "radix": radix}
    parts |= {"shm": ShmReqManager(), "io": IOBuffer()}
    backend = _backend(m, args, parts, token_salt)
    m.cp.time = types.SimpleNamespace(**vars(time))
    m.cp.time.sleep = lambda seconds: None
    m.ib.g_infer_context.register(
        backend=backend,
        req_manager=req_manager,
        radix_cache=radix,
        shm_req_manager=parts["shm"],
        vocab_size=backend.model.vocab_size,
    )
    ctx = m.ib.g_infer_context
    if ctx.is_linear_att_mixed_model != (sizes.cache == "linear"):
        raise RuntimeError("LightLLM did not take the request manager for the hybrid model")
    return InferParts(
        cache=sizes.cache,
        modules=m,
        args=args,
        small=small,
        backend=backend,
        ctx=ctx,
        **parts,
    )
