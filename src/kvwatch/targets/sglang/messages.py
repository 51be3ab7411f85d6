"""The messages between SGLang's scheduler and its clients, as its tokenizer manager sends
and reads them.

* ``generate``: a ``TokenizedGenerateReqInput`` (token ids, greedy
  ``SamplingParams`` normalized and verified as the tokenizer manager does,
  a session's ``SessionParams``, a priority), in the release's own class;
* ``RequestHandle``: what ``submit`` hands the workload, SGLang's own ``Req``
  once the scheduler made one, the message's tokens until then;
* ``ends``: the requests a message from the scheduler ends, with their finish
  reasons (a batch's outputs, or an ``AbortReq`` it sent back);
* ``tokenizer_sends_arrays``: whether the release's tokenizer manager sends
  token ids as ``array("q")``.

Invariant: only the release's own message classes are built, with only the
keyword arguments they take (``call_offered``).
"""

from __future__ import annotations

import importlib
import inspect
from array import array
from types import SimpleNamespace
from typing import Any

from kvwatch.targets.sglang import scheduler_host
from kvwatch.targets.sglang.loop_parts import call_offered
from kvwatch.targets.sglang.release_import import Release


class RequestHandle:
    """A submitted request: its ``Req`` once the scheduler made one."""

    def __init__(self, rid: str, input_ids: list[int], max_new_tokens: int) -> None:
        self.rid, self.sent_ids, self.max_new_tokens = rid, input_ids, max_new_tokens
        self.req: Any = None
        self.abort_reason: Any = None  # a FINISH_ABORT when it never became a Req

    def __getattr__(self, name: str) -> Any:
        req = self.__dict__.get("req")
        if req is not None:
            return getattr(req, name)
        unseen = {
            "origin_input_ids": self.sent_ids,
            "output_ids": [],
            "finished_len": 0,
            "finished_reason": self.abort_reason,
            "sampling_params": SimpleNamespace(max_new_tokens=self.max_new_tokens),
        }
        if name in unseen:
            return unseen[name]
        raise AttributeError(f"request {self.rid} never reached the scheduler: no {name!r}")


def generate(
    io: Any,
    rid: str,
    input_ids: list[int],
    max_new_tokens: int,
    *,
    session_id: str | None,
    priority: int | None,
    arrays: bool,
) -> Any:
    """The release's ``TokenizedGenerateReqInput`` for one greedy request."""
    module = importlib.import_module("sglang.srt.sampling.sampling_params")
    params = module.SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    params.normalize(None)
    if "vocab_size" in inspect.signature(params.verify).parameters:
        params.verify(scheduler_host.VOCAB)
    else:
        params.verify()
    session = None
    if session_id is not None:
        session = call_offered(io.SessionParams, id=session_id)
    ids = array("q", input_ids) if arrays else list(input_ids)
    return call_offered(
        io.TokenizedGenerateReqInput,
        rid=rid,
        input_text="",
        input_ids=ids,
        mm_inputs=None,
        input_embeds=None,  # required fields of 0.5.22+'s message
        token_type_ids=None,
        sampling_params=params,
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=False,
        priority=priority,
        session_params=session,
    )


def ends(message: Any) -> list[tuple[str, dict]]:
    """The requests a message from the scheduler ends, with their finish reasons."""
    if type(message).__name__ == "AbortReq":
        return [(message.rid, dict(message.finished_reason or {"type": "abort"}))]
    rids = getattr(message, "rids", None) or []
    reasons = getattr(message, "finished_reasons", None) or [None] * len(rids)
    out = []
    for rid, reason in zip(rids, reasons, strict=False):
        if reason:
            out.append((rid, reason if isinstance(reason, dict) else reason.to_json()))
    return out


def tokenizer_sends_arrays(release: Release) -> bool:
    """Whether the release's tokenizer manager sends token ids as ``array("q")``."""
    manager = release.root / "sglang/srt/managers/tokenizer_manager.py"
    return manager.is_file() and 'array("q", input_ids)' in manager.read_text()
