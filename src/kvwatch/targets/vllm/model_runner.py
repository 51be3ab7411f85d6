"""What a model runner would return to vLLM's scheduler, with no model.

Each request whose prompt is computed after a step gets one token
(``next_token``), one still in a prefill chunk gets none, as vLLM's model
runner does. The token is a function of the request's id and length only (and
of a salt, the plan's ``token_salt``), never EOS, so a run is the same at any
speed and a test can swap the function and see vLLM's own code still decide
the verdict. vLLM is imported inside ``model_output`` only.
"""

from __future__ import annotations

import dataclasses
import zlib


def next_token(request_id: str, num_tokens: int, salt: int = 0) -> int:
    """The token the model runner samples: a function of the request's id and length
    only, in 100..1599 (never EOS). A non-zero ``salt`` (the plan's ``token_salt``)
    gives another function of the same inputs: a CRC of the salt, the id and the length."""
    if salt:
        return 100 + zlib.crc32(f"{salt}:{request_id}:{num_tokens}".encode()) % 1500
    return 100 + (sum(map(ord, request_id)) * 31 + num_tokens) % 1500


def model_output(scheduler, out, token_salt: int = 0):
    """What a model runner returns for ``out``: a token for each request whose prompt is
    computed after this step (``next_token``), nothing for one still in a prefill chunk."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        request = scheduler.requests[rid]
        token = next_token(rid, request.num_tokens, token_salt)
        sampled.append([token] if request.num_computed_tokens >= request.num_tokens else [])
    fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    wanted = {
        "req_ids": ids,
        "req_id_to_index": {rid: i for i, rid in enumerate(ids)},
        "sampled_token_ids": sampled,
        "logprobs": None,
        "prompt_logprobs_dict": {},
        "pooler_output": [],
    }
    return ModelRunnerOutput(**{k: v for k, v in wanted.items() if k in fields})
