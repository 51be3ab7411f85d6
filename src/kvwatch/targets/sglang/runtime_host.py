"""What the own scheduler needs beyond ``scheduler_setup`` on releases that read
``sglang.srt.runtime_context`` (0.5.16+).

From 0.5.16 SGLang's scheduler reads its settings through
``runtime_context`` ("config bags": ``get_schedule().page_size``,
``get_memory().radix_eviction_policy``, ``get_parallel().tp_rank``) rather
than from the ``ServerArgs`` object, and its ``__init__`` orchestrates some
forty ``init_*`` steps over ``managers/scheduler_components/``. The release's
own ``runtime_context`` does that work here, unchanged:

* ``PLAN``: ``scheduler_imports.PLAN`` with ``runtime_context``, the
  argument groups, ``environ`` and the two registries the bags read imported
  from the wheel, and ``REAL_ANSWERS``: modules a stub would answer wrong or only by
  luck (docs/sglang-stubs-audit.md), pure Python, imported as they ship;
* ``server_args``: the release's ``ServerArgs`` over the run's settings (a
  ``msgspec`` struct from 0.5.20, built by its own constructor; a dataclass
  before, its declared defaults), made the process's configuration the way
  the release's scheduler process does: ``publish(role="scheduler",
  ranks=SpawnRanks(...))`` (0.5.22+), ``publish(role="scheduler")``
  (0.5.20, 0.5.21) or ``set_global_server_args_for_scheduler`` (0.5.16 ..
  0.5.19); the process groups and ranks the parallel context would read from
  ``torch.distributed`` are one rank's (``_one_rank``);
* ``fit_worker``: what the release's own ``get_worker_info`` and cache
  builder read of a model runner (capacities, no draft pools, no n-gram
  embeddings), and that method body compiled over the release's bags;
* ``host_names``: the names the scheduler's modules import from stubbed ones
  and call for data: the DP-attention world and TP group of one rank, the
  model family (``uses_ssm_state`` true only for a mamba run, never a
  DeepSeek DSA model), the expert balance windows' literal, the state
  capturers' getters compiled from the release (``capturers``: None);
* ``ENVIRONMENT``: the pure-Python tree core (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``),
  since the Rust core is a compiled extension this host does not build.

Invariant: every value given is what a single-rank CPU server with this
run's settings would read; no line of SGLang's admission, scheduling,
retraction, abort or cache code is replaced.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

from kvwatch.targets.sglang import scheduler_host, scheduler_imports
from kvwatch.targets.sglang.loop_parts import LoopConfig
from kvwatch.targets.sglang.release_import import Release
from kvwatch.targets.sglang.stand_in_worker import GROUP

RUNTIME_CONTEXT = "from sglang.srt.runtime_context import"  # 0.5.16+: in scheduler.py
CONTEXT = "sglang.srt.runtime_context"
HELD: list[Any] = []  # parallel overrides entered for the process (_one_rank)
ENVIRONMENT = {"SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python"}
GROUPS = ("world", "tp", "pp", "attn_tp", "attn_cp", "moe_ep", "moe_dp", "moe_tp")
# the model families kv_cache_builder asks about (configs.hybrid_arch is a stand-in)
FAMILIES = (
    *("hybrid_gdn_config", "mamba2_config", "kimi_linear_config", "glm5_next_config"),
    *("hybrid_lightning_config", "linear_attn_model_spec"),
)

# modules whose answers a stub would give wrong or only by luck, pure Python and
# imported as they ship (docs/sglang-stubs-audit.md says where each is read)
REAL_ANSWERS = (
    "sglang.srt.managers.min_free_slots_delayer",  # None: no delayer, not a stub one
    "sglang.srt.dllm.config",
    "sglang.srt.dllm.mixin.req",  # Req's base: dllm_config None, no stub attributes
    "sglang.srt.hardware_backend.mlx.runtime",  # use_mlx(): SGLANG_USE_MLX unset
    "sglang.srt.layers.attention.dsv4.unified_kv_gate",  # 0.5.23: is_unified_kv_triton
    "sglang.kernels.ops.attention.dsv4.unified_kv_kernels.env_gate",  # 0.5.22: the same
    "sglang.srt.constrained.grammar_manager",  # no grammar backend: nothing queued
    "sglang.srt.configs.shared_experts",
)
# functions the scheduler's modules import from stubbed ones, compiled from the release
CAPTURERS = (
    ("sglang/srt/state_capturer/indexer_topk.py", "get_global_indexer_capturer"),
    ("sglang/srt/state_capturer/routed_experts.py", "get_global_experts_capturer"),
)

PLAN = scheduler_imports.PLAN._replace(
    real=(
        *scheduler_imports.PLAN.real,
        CONTEXT,
        "sglang.srt.arg_groups",
        "sglang.srt.environ",
        "sglang.srt.model_executor.cuda_graph_config",
        "sglang.srt.lora.lora_registry",
        *REAL_ANSWERS,
    ),
    unfixed=(*scheduler_imports.PLAN.unfixed, CONTEXT),
    utils={
        **(scheduler_imports.PLAN.utils or {}),
        "SUPPORTED_LORA_TARGET_MODULES": ["q_proj"],  # read by the LoRA argument group
        "LORA_TARGET_ALL_MODULES": "all",
        # no device memory to size defaults by: the run's settings name them all
        "get_device_memory_capacity": lambda *a, **k: None,
    },
)


def applies(root: Path) -> bool:
    """Whether the release extracted at ``root`` reads ``runtime_context``."""
    scheduler = root / "sglang" / "srt" / "managers" / "scheduler.py"
    return RUNTIME_CONTEXT in scheduler.read_text()


def server_args(release: Release, settings: dict[str, Any]) -> Any:
    """The release's ``ServerArgs`` over ``settings``, published for the scheduler."""
    module = importlib.import_module("sglang.srt.server_args")
    context = importlib.import_module(CONTEXT)
    wanted = dict(
        settings,
        model_path="dummy",  # SGLang's own word for no model to read (no HF config)
        tokenizer_path=None,
        # "auto" resolves against the built pool's device kind; a CPU tensor copy
        disaggregation_decode_retraction_backup="cpu_tensor",
    )
    if hasattr(module.ServerArgs, "__struct_fields__"):  # 0.5.20+: a msgspec struct
        declared = set(module.ServerArgs.__struct_fields__)
        args = module.ServerArgs(**{k: v for k, v in wanted.items() if k in declared})
    else:  # 0.5.16 .. 0.5.19: the dataclass of older releases
        args = scheduler_host.server_args(module.ServerArgs, **wanted)
    # a mamba cache's chunk is read from the model's HF config, which "dummy" has
    # none of: seeded as SGLang's own test fixtures seed it, from its kernel's literal
    args._mamba_cache_chunk_size = max(_fla_chunk_size(release.root), settings["page_size"])
    if hasattr(context, "SpawnRanks"):  # 0.5.22+
        ranks = context.SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0)
        context.publish(args, role="scheduler", ranks=ranks)
        context.get_parallel().override_permanently(**{f"{g}_group": GROUP for g in GROUPS})
        return args
    if hasattr(context, "publish"):  # 0.5.20, 0.5.21
        context.publish(args, role="scheduler")
    else:  # 0.5.16 .. 0.5.19
        module.set_global_server_args_for_scheduler(args)
    _one_rank(context)
    return args


def _one_rank(context: Any) -> None:
    """Every parallel field of a release without ``SpawnRanks`` answered as one
    rank (sizes 1, ranks 0, no decode context parallelism, the one-rank group),
    through the parallel context's own ``override``, held for the process."""
    one = {}
    for name in context._PARALLEL_FIELDS:
        if name.endswith("_group"):
            one[name] = GROUP
        elif name.endswith("_size"):
            one[name] = 1
        else:  # *_rank, dcp_enabled
            one[name] = 0 if name.endswith("_rank") else False
    held = context.get_parallel().override(**one)
    held.__enter__()
    HELD.append(held)  # a dropped generator would exit and restore the old values


def _fla_chunk_size(root: Path) -> int:
    """``CHUNK_SIZE`` of the release's FLA kernel (64 where the wheel has none,
    as SGLang's own fallback says)."""
    kernel = "sglang/kernels/ops/attention/fla/chunk_delta_h.py"
    return scheduler_host.release_literal(root, kernel, "CHUNK_SIZE") or 64


def fit_worker(worker: Any, release: Release, config: LoopConfig, args: Any) -> None:
    """What the release reads of its worker and model runner beyond older releases."""
    runner, tokens = worker.model_runner, config.pools.kv_tokens
    capacities = (
        "max_total_num_tokens",
        "effective_max_total_num_tokens",
        "logical_max_total_num_tokens",
        "effective_logical_max_total_num_tokens",
    )
    vars(runner).update(
        dict.fromkeys(capacities, tokens),
        token_to_kv_pool_allocator=worker.pools.allocator,
        token_to_kv_pool=SimpleNamespace(post_capture_active=False, size=tokens),
        req_to_token_pool=worker.pools.req_to_token_pool,
        memory_pool_config=SimpleNamespace(),
        mtp_draft_device_pools=(),
        mtp_draft_mamba_pools=(),
        device="cpu",
        dcp_size=1,  # 0.5.17: no decode context parallelism
        model_config=worker.model_config,
        max_running_requests=config.max_running_requests,
        prefill_aware_swa=False,
        prewarm_sampling=lambda: None,
        ngram_embedding_manager=SimpleNamespace(prepare_for_forward=lambda b, **_: b),
    )
    worker.server_args, worker.dllm_algorithm = args, None
    worker.ps = SimpleNamespace(attn_dcp_size=1, dcp_size=1, tp_size=1)
    worker.weight_load_time = worker.graph_time_usage = worker.graph_memory_usage = 0.0
    worker.init_attention_backends = worker.init_cuda_graphs = lambda: None
    interleave = importlib.import_module("sglang.srt.mem_cache.allocator.page_interleave")
    scope = {
        **vars(importlib.import_module(CONTEXT)),
        "page_interleave_shard_size": interleave.page_interleave_shard_size,
        "logger": logging.getLogger("sglang.srt.managers.tp_worker"),
    }
    body = scheduler_host.release_function(
        release.root, "sglang/srt/managers/tp_worker.py", "get_worker_info", scope
    )
    worker.get_worker_info = lambda: body(worker)


def host_names(release: Release, config: LoopConfig) -> dict[str, Any]:
    """Names the scheduler's modules import from stand-ins, answered as one rank."""
    world = scheduler_host.release_function(
        release.root,
        "sglang/srt/layers/dp_attention.py",
        "compute_dp_attention_world_info",
        vars(importlib.import_module(CONTEXT)),
    )
    names = {"compute_dp_attention_world_info": world, "get_dp_tp_group": lambda: GROUP}
    eplb = "sglang/srt/eplb/expert_distribution.py"
    windows = scheduler_host.release_literal(release.root, eplb, "EPLB_BALANCEDNESS_WINDOW_SIZES")
    if windows is not None:  # 0.5.20+: the metrics reporter imports it
        names["EPLB_BALANCEDNESS_WINDOW_SIZES"] = windows
    common = "sglang/srt/utils/common.py"
    if "\nclass Range(NamedTuple):" in (release.root / common).read_text():  # 0.5.16 .. 0.5.21
        # Req.extend_range's type, a plain NamedTuple of the utils the host stands in for
        names["Range"] = scheduler_host.release_function(
            release.root, common, "Range", {"NamedTuple": NamedTuple}
        )
    return names | capturers(release)


def capturers(release: Release) -> dict[str, Any]:
    """The release's own state-capturer getters over its context (None: nothing
    is captured), where a stub would hand back a capturer that is not None."""
    scope = vars(importlib.import_module(CONTEXT))
    return {
        name: scheduler_host.release_function(release.root, path, name, scope)
        for path, name in CAPTURERS
        if (release.root / path).is_file()
    }


def model_family(config: LoopConfig) -> None:
    """The model family the cache builder reads (``configs.hybrid_arch`` and
    ``configs.model_config`` are stand-ins): a hybrid SSM model for a mamba run,
    a plain decoder otherwise, never a DeepSeek DSA one; and the builder's
    tree-cache group is the one rank's (``get_dp_tp_group`` comes from a stub)."""
    builder = importlib.import_module("sglang.srt.mem_cache.kv_cache_builder")
    for name in FAMILIES:
        setattr(builder, name, _answer(None))
    if config.pools.mamba_slots is not None:
        builder.hybrid_gdn_config = _answer(SimpleNamespace())
    builder.get_dp_tp_group = lambda: GROUP
    # the scheduler imports it from the stub module inside a method
    for module in (builder, importlib.import_module("sglang.srt.configs.model_config")):
        module.is_deepseek_dsa = _answer(False)


def _answer(value: Any) -> Any:
    return lambda *_, **__: value
