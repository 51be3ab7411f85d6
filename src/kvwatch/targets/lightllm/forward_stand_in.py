"""The model and the sampler, stood in: what a forward does to LightLLM's pools, nothing else.

* ``StandInModel.forward(model_input)``: LightLLM's model writes the batch's
  new KV slots into ``req_to_token_indexs`` (``init_req_to_token_indexes``
  for a prefill chunk, ``copy_kv_index_to_req`` for a decode step); this
  does the same, from LightLLM's own ``ModelInput``, and computes nothing;
* ``cpu_backend(ChunkedPrefillBackend)``: LightLLM's default backend with
  ``_sample_and_scatter_token`` replaced by the model's ``sample``, a fixed
  token function (``next_token``) that never gives EOS (a request ends by
  its ``max_new_tokens``, or an abort). Everything else the backend does is
  LightLLM's.

A run plan's ``token_salt`` (absent: 0) makes ``next_token`` another
function of the same inputs, so a test can swap what kvwatch plays of the
model and see that LightLLM's own code still decides the verdict; the model
counts the tokens it sampled, and the driver writes both into its record.
"""

from __future__ import annotations

import inspect
import types
import zlib
from typing import Any


def next_token(req: Any, salt: int = 0) -> int:
    """A token that depends only on the request and its length, in 1000..1999 (never
    EOS). A non-zero ``salt`` gives another function of the same inputs: a CRC of the
    salt, the request's id and its length."""
    if salt:
        return 1000 + zlib.crc32(f"{salt}:{req.req_id}:{req.get_cur_total_len()}".encode()) % 1000
    return 1000 + (req.req_id * 131 + req.get_cur_total_len() * 7) % 1000


class StandInModel:
    def __init__(self, req_manager: Any, mem_manager: Any, token_salt: int = 0) -> None:
        self.req_manager, self.mem_manager = req_manager, mem_manager
        self.vocab_size = 4096
        self.forwards = 0
        self.return_all_prompt_logics = False
        self.token_salt, self.sampled = token_salt, 0

    def sample(self, reqs: list) -> list[int]:
        """The next token of each of ``reqs`` (``next_token``), counted."""
        ids = [next_token(r, self.token_salt) for r in reqs]
        self.sampled += len(ids)
        return ids

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
            ids = self.model.sample(run_reqs)
            logprobs = [0.0] * len(ids)
            if with_ranks:
                return ids, ids, logprobs, [1] * len(ids)
            return ids, ids, logprobs

    return CpuBackend
