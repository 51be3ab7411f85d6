"""LightLLM's infer loop as the history tier's loop: ``InferLoop`` with the player's reads.

The history tier names requests with strings (``r0001``); LightLLM's router
numbers them. ``HistoryInferLoop`` keeps the map and answers the reads a
played history needs:

* ``stage``: waiting for a request slot, or sent and not yet taken by the
  infer side, is ``queued``; an ``InferReq`` LightLLM paused (memory ran out)
  is ``paused``; one whose prompt is not yet computed is ``prefilling``, else
  ``decoding``;
* ``input_of`` / ``output_of``: the shared-memory record's prompt and the
  tokens generated into it;
* ``hit_of``: ``prompt_cache_len`` as LightLLM set it when the request was
  first admitted (its ``match_prefix`` hit), ``admitted`` once the infer side
  held it.

LightLLM has no sessions and no priorities here; a prompt over the context
(``max_seq``) is refused, as its router refuses it.

``make_loop`` is the factory the history tier's driver process calls
(``histories/driver_process.py``, started by ``histories.LightllmHistoryTarget``
with kvwatch's own Python): a fresh ``build`` of the checkout's pools, cache
and backend, and its ``InferProbe``, for each history.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from kvwatch.targets.driver.engine_loop import Refused
from kvwatch.targets.lightllm.infer_build import InferParts, InferSizes, build
from kvwatch.targets.lightllm.loop import InferLoop
from kvwatch.targets.lightllm.probe import InferProbe


class HistoryInferLoop(InferLoop):
    def __init__(self, parts: InferParts, context: int) -> None:
        super().__init__(parts)
        self.context = context
        self.number: dict[str, int] = {}  # the history's id -> LightLLM's
        self.name: dict[int, str] = {}
        self.hits: dict[int, int] = {}  # prompt tokens found cached at first admission
        self.observers.append(self._note_admitted)

    def submit(self, rid: Any, prompt: list[int], max_new: int, **options: Any) -> Any:
        if options.get("session_id"):
            raise Refused("LightLLM has no sessions")
        if not prompt or len(prompt) + max_new > self.context:
            raise Refused(
                f"the input ({len(prompt)} tokens) and max_new_tokens ({max_new}) do not fit "
                f"the context of {self.context}"
            )
        if rid in self.number:
            raise Refused(f"request id {rid} was sent already")
        n = len(self.number) + 1
        self.number[rid], self.name[n] = n, rid
        return super().submit(n, prompt, max_new)

    def abort(self, rid: Any) -> None:
        n = self.number.get(rid)
        if n is not None and not any(o.rid == rid for o in self.outcomes):
            before = len(self.outcomes)
            super().abort(n)  # one still waiting for a slot ends here
            self._rename(before)
            self.notify()

    def _note_released(self) -> None:
        for n in self.parts.shm.put_back[self._released :]:
            record = self.requests[n]
            if n not in self.hits and record.shm_cur_kv_len > 0:  # admitted and gone in a step
                self.hits[n] = int(record.prompt_cache_len)
        before = len(self.outcomes)
        super()._note_released()
        self._rename(before)

    def _note_admitted(self) -> None:
        """An ``InferReq`` exists once the infer side took the request in, and its
        constructor has matched the prompt against the tree (``prompt_cache_len``)."""
        for n in self.parts.ctx.requests_mapping:
            if n not in self.hits:
                self.hits[n] = int(self.requests[n].prompt_cache_len)

    def _rename(self, start: int) -> None:
        """Outcomes from ``start`` on under the history's ids."""
        for i in range(start, len(self.outcomes)):
            o = self.outcomes[i]
            self.outcomes[i] = o._replace(rid=self.name.get(o.rid, o.rid))

    def live_rids(self) -> list[Any]:
        ended = {o.rid for o in self.outcomes}
        return [rid for rid in self.number if rid not in ended]

    # -- reads ---------------------------------------------------------------------------
    def stage(self, rid: Any) -> str | None:
        n = self.number.get(rid)
        if n is None or any(o.rid == rid for o in self.outcomes):
            return None
        req = self.parts.ctx.requests_mapping.get(n)
        if req is None:
            return "queued"  # waiting for a slot, or sent and not yet taken in
        if getattr(req, "paused", False):
            return "paused"
        return "prefilling" if req.cur_kv_len < req.shm_req.input_len else "decoding"

    def input_of(self, rid: Any) -> tuple[int, ...] | None:
        n = self.number.get(rid)
        return None if n is None else tuple(self.requests[n].get_prompt_ids())

    def output_of(self, rid: Any) -> tuple[int, ...]:
        n = self.number.get(rid)
        return () if n is None else tuple(self.requests[n].outputs())

    def hit_of(self, rid: Any) -> int | None:
        n = self.number.get(rid)
        return None if n is None else self.hits.get(n)

    def admitted(self, rid: Any) -> bool:
        n = self.number.get(rid)
        return n is not None and n in self.hits


def make_loop(setup: dict, checkout: str) -> tuple[HistoryInferLoop, InferProbe]:
    """A fresh LightLLM of ``setup`` (``InferSizes`` as plain data) from ``checkout``,
    as the history tier's loop and probe. ``build`` clears LightLLM's cached start
    args and registers a new infer context, so each history starts from nothing."""
    torch.set_num_threads(1)
    known = {f.name for f in fields(InferSizes)}
    sizes = InferSizes(**{k: v for k, v in setup.items() if k in known})
    loop = HistoryInferLoop(build(Path(checkout), sizes), context=sizes.max_seq)
    return loop, InferProbe(loop)
