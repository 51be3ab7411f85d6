"""The model worker a release's own ``Scheduler`` drives on a CPU host: ours.

The scheduler builds its worker itself (``TpModelWorker(...)`` in its
``__init__`` or ``init_tp_model_worker``); the release's ``tp_worker``
module is served as ``tp_worker_module``, whose ``TpModelWorker`` (and
``TpModelWorkerClient``) make a ``StandInWorker``:

* it owns the release's own pools (``kv_pools.build``: ``ReqToTokenPool`` or
  ``HybridReqToTokenPool`` with its ``MambaPool``, the token allocator),
  sized by the run's ``PoolConfig``, and hands them to the scheduler
  through ``get_memory_pool``, as SGLang's worker does;
* its limits are SGLang's formulas over those sizes (``max_req_len =
  min(context_len - 1, max_total_num_tokens - 1)``, ``max_req_input_len =
  max_req_len - 5``), and ``get_worker_info`` is the release's own method
  body run on it (its tuple changed between releases);
* ``model_runner`` answers what the scheduler asks of a model runner: the
  pools, a CPU stream, and no model-family config (``*_config`` read as
  None) but ``hybrid_gdn_config`` for a hybrid SSM model, which is how the
  scheduler picks its ``MambaRadixCache``;
* ``forward_batch_generation`` returns the release's ``GenerationBatchResult``
  with one next token per request from ``TokenModel``: a function of the
  request's length and the seed, never EOS, so ``max_new_tokens`` ends
  every request.

Invariant: the worker holds no KV and runs no model; every pool and
allocator it hands out is the release's own class.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any, NamedTuple

from kvwatch.targets.sglang import kv_pools, scheduler_host
from kvwatch.targets.sglang.loop_parts import PoolConfig, call_offered
from kvwatch.targets.sglang.release_import import Release
from kvwatch.targets.stand_ins import StubModule

GROUP = SimpleNamespace(
    cpu_group=None,
    device_group=None,
    rank=0,
    rank_in_group=0,
    ranks=[0],
    world_size=1,
    first_rank=0,  # GroupCoordinator's ranks[0] and ranks[-1]: the grammar manager reads them
    last_rank=0,
    is_first_rank=True,
    is_last_rank=True,
)
CONTEXT_EXTRA = 4  # SGLang's req_to_token rows are a few tokens longer than the context


class TokenModel(NamedTuple):
    """The stand-in model: the next token of a request of ``seq_len`` tokens."""

    seed: int = 0

    def next_token(self, seq_len: int) -> int:
        span = scheduler_host.VOCAB - 3  # never 0-2: no padding, BOS or EOS
        return 3 + (seq_len * 7919 + self.seed * 104729 + 17) % span


class RunnerStandIn(SimpleNamespace):
    """``model_runner``: the attributes given; any ``*_config`` not given is None
    (the model is none of those families); anything else raises."""

    def __getattr__(self, name: str) -> Any:
        if name.endswith("_config") and not name.startswith("__"):
            return None
        raise AttributeError(f"the model runner stand-in has no {name!r}")


class StandInWorker:
    def __init__(self, release: Release, pools: PoolConfig, model: TokenModel, args: Any) -> None:
        import torch

        self.release, self.model = release, model
        context_len = pools.max_context_len
        self.pools = kv_pools.build(
            release, pools._replace(max_context_len=context_len + CONTEXT_EXTRA)
        )
        self.max_total_num_tokens = pools.kv_tokens
        self.max_prefill_tokens = args.max_prefill_tokens
        self.max_running_requests = args.max_running_requests
        self.max_queued_requests = args.max_queued_requests
        self.max_req_len = min(context_len - 1, pools.kv_tokens - 1)
        self.max_req_input_len = self.max_req_len - 5
        self.random_seed, self.device = 0, "cpu"
        # a hybrid sliding-window model (is_hybrid: the flag's name before 0.5.9)
        self.is_hybrid_swa = self.is_hybrid = pools.swa_tokens is not None
        self.sliding_window_size = pools.sliding_window
        self.swa_tokens = pools.swa_tokens
        self.model_config = scheduler_host.model_config(context_len)
        mamba = SimpleNamespace() if pools.mamba_slots is not None else None
        self.model_runner = RunnerStandIn(
            req_to_token_pool=self.pools.req_to_token_pool,
            token_to_kv_pool=self.pools.allocator,
            hybrid_gdn_config=mamba,
            mambaish_config=mamba,  # 0.5.5
            linear_attn_model_spec=None,
            forward_stream=torch.cpu.current_stream(),
            device_timer=None,
            lora_manager=None,
            canary_manager=None,
            attn_backend=None,
            weight_load_mem_usage=0.0,
            graph_mem_usage=0.0,
        )
        self.forwards = 0
        self.model_runner_token_pool = self.pools.allocator

    def get_worker_info(self) -> tuple:
        """The release's own ``TpModelWorker.get_worker_info``, run on this worker."""
        relpath = "sglang/srt/managers/tp_worker.py"
        return scheduler_host.release_function(self.release.root, relpath, "get_worker_info")(self)

    def get_memory_pool(self) -> tuple[Any, Any]:
        return self.pools.req_to_token_pool, self.pools.allocator

    def get_tp_group(self) -> SimpleNamespace:
        return GROUP

    def get_attention_tp_group(self) -> SimpleNamespace:
        return GROUP

    def get_attention_tp_cpu_group(self) -> None:
        return None

    def get_pad_input_ids_func(self) -> None:
        return None

    def get_tokens_per_layer_info(self) -> tuple[int, int | None]:
        return self.max_total_num_tokens, self.swa_tokens

    def forward_batch_generation(self, batch: Any, *_: Any, **__: Any) -> Any:
        """One forward: each request's next token from the token model."""
        import torch

        self.forwards += 1
        lens = batch.seq_lens.tolist()
        ids = torch.tensor([self.model.next_token(int(n)) for n in lens], dtype=torch.int64)
        logits = SimpleNamespace(
            **dict.fromkeys(
                (
                    "next_token_logits",
                    "next_token_logprobs",
                    "input_token_logprobs",
                    "next_token_top_logprobs_val",
                    "next_token_top_logprobs_idx",
                    "next_token_token_ids_logprobs_val",
                    "next_token_token_ids_logprobs_idx",
                    "hidden_states",
                    "customized_info",
                    "mm_input_embeds",
                    "auxiliary_device_output",  # 0.5.22+
                    "sampling_mask_output",
                    "next_token_sampling_mask_status",
                )
            )
        )
        result = importlib.import_module("sglang.srt.managers.utils").GenerationBatchResult
        return call_offered(
            result, logits_output=logits, next_token_ids=ids, can_run_cuda_graph=False
        )


def tp_worker_module(make: Any) -> StubModule:
    """``sglang.srt.managers.tp_worker`` whose worker classes make ours."""

    def factory(*_: Any, **__: Any) -> StandInWorker:
        return make()

    values = {"TpModelWorker": factory, "TpModelWorkerClient": factory}
    return StubModule("sglang.srt.managers.tp_worker", values)
