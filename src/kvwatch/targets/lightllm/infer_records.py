"""Stand-ins for what the router process hands LightLLM's infer loop, and the start args.

In LightLLM the HTTP server and the router put each request in a
shared-memory record (``core/objs/req.py``'s ``Req``) and send its index, or
an ``AbortedReqCmd``, through a shared-memory IO buffer to the infer
process. Here there is no router:

* ``ShmReq``: the record, with what the infer side reads: the prompt ids
  (then the outputs) in one array, the sampling params, the page hashes of
  the prompt in LightLLM's own ``TokenHashList`` (chained 128-bit hashes of
  ``(len - 1) // page`` pages, as ``utils/kv_cache_utils.compute_token_list_hash``
  computes them, with blake2b instead of xxh3: the values differ, the
  chaining does not), LightLLM's own ``FinishStatus``. Any other attribute
  raises (``Strict``): a LightLLM that reads more fails loudly;
* ``ShmReqManager``: index -> record;
* ``IOBuffer``: the command buffer. ``is_ready`` also paces the shipped
  loop: the infer loop asks it once per iteration, and the budget
  ``InferLoop.step`` gives it ends the loop there (``StopLoop``);
* ``start_args``: the JSON LightLLM reads from ``LIGHTLLM_START_ARGS``.
"""

from __future__ import annotations

import hashlib
import types
from typing import Any

import numpy as np

EOS = 2


class StopLoop(BaseException):
    """Ends ``infer_loop`` once an iteration budget is spent."""


def start_args(**over: Any) -> dict:
    """LightLLM's start args for one run: the default backend (chunked prefill, no
    overlap, no MTP, no DP, no CPU cache), with the workload's sizes over them."""
    args = {
        **{"run_mode": "normal", "node_rank": 0, "tp": 1, "dp": 1, "nnodes": 1},
        **{"model_dir": "/nonexistent", "mtp_step": 0, "mtp_mode": None, "diverse_mode": False},
        **{"enable_cpu_cache": False, "enable_prefill_decode_mixed": False},
        **{"disable_chunked_prefill": False, "chunked_prefill_size": 16, "batch_max_tokens": 64},
        **{"max_req_total_len": 512, "linear_att_hash_page_size": 4},
        **{"linear_att_page_block_num": 4, "linear_att_cache_size": 4},
        **{"cpu_cache_token_page_size": 16, "penalty_counter_mode": "cpu_counter"},
        **{"data_type": "float16", "linear_att_ssm_data_type": "float32"},
        **{"disable_aggressive_schedule": False, "router_max_wait_tokens": 6},
        **{"disable_dynamic_prompt_cache": False, "enable_multimodal": False},
        "output_constraint_mode": "none",
    }
    args.update(over)
    return args


class Strict:
    """A record whose unknown attributes raise (what LightLLM reads is all there is)."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{type(self).__name__} stand-in has no {name!r}")


class _Text:
    def __init__(self, text: str = "") -> None:
        self.text = text

    def to_str(self) -> str:
        return self.text


class _Ids:
    def __init__(self, values: tuple = ()) -> None:
        self.values = list(values)

    def to_list(self) -> list:
        return list(self.values)


class SampleParams(Strict):
    def __init__(self, max_new_tokens: int) -> None:
        self.max_new_tokens = max_new_tokens
        self.disable_prompt_cache = False
        self.top_k = -1
        self.regular_constraint = self.guided_grammar = self.guided_json = _Text()
        self.allowed_token_ids = _Ids()
        self.invalid_token_ids = _Ids()
        self.pd_kv_trans_params = types.SimpleNamespace(data_len=0, get=lambda: b"")
        self.pd_master_node_id = types.SimpleNamespace(get=lambda: 0)
        self.seed = -1
        self.stop_sequences = _Ids()
        self.ignore_eos = False
        self.presence_penalty = self.frequency_penalty = 0.0
        self.repetition_penalty = 1.0
        self.exponential_decay_length_penalty = types.SimpleNamespace(to_tuple=lambda: (1, 1.0))
        self.input_penalty = False
        self.suggested_dp_index = 0
        self.return_prompt_logprobs = False
        self.prompt_logprobs_topk = 0
        self.return_routed_experts = False


def page_hashes(tokens: list[int], page: int) -> list[int]:
    """Chained 128-bit hashes of the first ``(len(tokens) - 1) // page`` pages."""
    out, running = [], hashlib.blake2b(digest_size=16)
    for i in range((len(tokens) - 1) // page):
        running.update(np.asarray(tokens[i * page : (i + 1) * page], dtype=np.uint64).tobytes())
        out.append(int.from_bytes(running.copy().digest(), "little"))
    return out


class ShmReq(Strict):
    """One request's record; ``kinds`` holds LightLLM's ``TokenHashList`` and
    ``FinishStatus`` classes."""

    def __init__(self, *, index: int, rid: int, prompt: list[int], max_new: int, page: int, kinds):
        self.index_in_shm_mem = index
        self.request_id = self.group_req_id = rid
        self.input_len = len(prompt)
        size = len(prompt) + max_new + 8
        self.shm_prompt_ids = types.SimpleNamespace(arr=np.zeros(size, dtype=np.int64))
        self.shm_prompt_ids.arr[: len(prompt)] = prompt
        self.shm_logprobs = types.SimpleNamespace(arr=np.zeros(size, dtype=object))
        self.prefix_token_ids = np.zeros(0, dtype=np.int64)
        self.sample_params = SampleParams(max_new)
        self.linear_att_token_hash_list = kinds.hash_list()
        self.linear_att_token_hash_list.clear()
        self.linear_att_token_hash_list.fill(page_hashes(list(prompt), page) if page else [])
        self.prompt_cache_len = self.shm_cur_kv_len = self.shm_cur_output_len = 0
        self.candetoken_out_len = self.mtp_accepted_token_num = 0
        self.finish_token_index = -1
        self.finish_status = kinds.finish_status()
        self.is_paused = self.shm_infer_released = False
        self.simulated_finish = None

    def link_prompt_ids_shm_array(self) -> None:
        pass

    def link_logprobs_shm_array(self) -> None:
        pass

    def get_prompt_ids(self) -> list[int]:
        return self.shm_prompt_ids.arr[: self.input_len].tolist()

    def get_prompt_ids_numpy(self):
        return self.shm_prompt_ids.arr[: self.input_len]

    def outputs(self) -> list[int]:
        """What the loop generated so far (kvwatch's read, not LightLLM's)."""
        start = self.input_len
        return self.shm_prompt_ids.arr[start : start + self.shm_cur_output_len].tolist()

    def mark_simulated_finished(self, finish_status: int = 3, output_len: int = 0) -> bool:
        if self.finish_status.is_finished():
            return False
        self.simulated_finish = (finish_status, output_len)
        self.finish_status.set_status(finish_status)
        return True


class ShmReqManager(Strict):
    def __init__(self) -> None:
        self.reqs: dict[int, ShmReq] = {}
        self.put_back: list[int] = []  # request ids the infer side released, in order

    def get_req_obj_by_index(self, index: int) -> ShmReq:
        return self.reqs[index]

    def put_back_req_obj(self, req: ShmReq) -> None:
        self.put_back.append(req.request_id)


class IOBuffer:
    """New-request tuples and ``AbortedReqCmd`` objects for the infer side."""

    def __init__(self) -> None:
        self.cmds: list = []
        self.budget = 0

    def is_ready(self) -> bool:
        if self.budget <= 0:
            raise StopLoop()
        self.budget -= 1
        return bool(self.cmds)

    def read_obj(self) -> list:
        cmds, self.cmds = self.cmds, []
        return cmds

    def sub_state(self) -> None:
        pass


class MultimodalParams:
    def to_dict(self) -> dict:
        return {"images": [], "audios": []}
