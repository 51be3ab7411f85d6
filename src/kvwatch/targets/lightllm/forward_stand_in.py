"""The model and the sampler, stood in: what a forward does to LightLLM's pools, nothing else.

* ``StandInModel.forward(model_input)``: LightLLM's model writes the batch's
  new KV slots into ``req_to_token_indexs`` (``init_req_to_token_indexes``
  for a prefill chunk, ``copy_kv_index_to_req`` for a decode step); this
  does the same, from LightLLM's own ``ModelInput``, and computes nothing;
* ``cpu_backend(ChunkedPrefillBackend)``: LightLLM's default backend with
  ``_sample_and_scatter_token`` replaced by a fixed token function that
  never gives EOS (a request ends by its ``max_new_tokens``, or an abort).
  Everything else the backend does is LightLLM's.
"""

from __future__ import annotations

import inspect
import types
from typing import Any


def next_token(req: Any) -> int:
    """A token that depends only on the request and its length (never EOS)."""
    return 1000 + (req.req_id * 131 + req.get_cur_total_len() * 7) % 1000


class StandInModel:
    def __init__(self, req_manager: Any, mem_manager: Any) -> None:
        self.req_manager, self.mem_manager = req_manager, mem_manager
        self.vocab_size = 4096
        self.forwards = 0
        self.return_all_prompt_logics = False

    def forward(self, model_input: Any) -> types.SimpleNamespace:
        self.forwards += 1
        rows = self.req_manager.req_to_token_indexs
        mem = model_input.mem_indexes_cpu
        if model_input.is_prefill:
            pos = 0
            for i in range(model_input.batch_size):
                idx = int(model_input.b_req_idx[i])
                start, end = int(model_input.b_ready_cache_len[i]), int(model_input.b_seq_len[i])
                rows[idx, start:end] = mem[pos : pos + end - start]
                pos += end - start
            assert pos == len(mem), "the prefill batch's slots do not cover its chunks"
        else:
            for i in range(model_input.batch_size):
                rows[int(model_input.b_req_idx[i]), int(model_input.b_seq_len[i]) - 1] = mem[i]
        return types.SimpleNamespace(logits=None, prompt_logics=None)


def cpu_backend(base: type) -> type:
    """``base`` (LightLLM's ``ChunkedPrefillBackend``) with the stand-in sampler. The
    sampler's return shape follows the checkout (with or without token ranks)."""
    with_ranks = "next_token_ranks" in inspect.getsource(base._sample_and_scatter_token)

    class CpuBackend(base):
        def _sample_and_scatter_token(self, logits, b_req_idx, b_mtp_index, run_reqs, *a, **k):
            ids = [next_token(r) for r in run_reqs]
            logprobs = [0.0] * len(ids)
            if with_ranks:
                return ids, ids, logprobs, [1] * len(ids)
            return ids, ids, logprobs

    return CpuBackend
