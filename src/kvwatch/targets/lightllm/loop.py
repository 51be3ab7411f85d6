"""LightLLM's own infer loop as an ``EngineLoop`` (``../driver``): one iteration a step, and
the router's side of it.

``InferLoop(parts)`` (``infer_build.build``) is what a workload drives:

* ``submit(rid, prompt, max_new)`` and ``abort(rid)`` do what LightLLM's
  router does: a shared-memory record (``infer_records.ShmReq``) and its
  index, or an ``AbortedReqCmd``, into the infer side's IO buffer. Like the
  router, it sends no more requests than the request manager has slots
  for (the rest wait, in order, and an abort of a waiting one drops it);
  it does not budget tokens: LightLLM's own pause handles memory;
* ``step()`` runs one iteration of the backend's shipped
  ``ChunkedPrefillBackend.infer_loop``: admission
  (``_read_reqs_buffer_and_init_reqs`` -> ``InferReq`` -> the cache's
  ``match_prefix``), classification (``_get_classed_reqs``: finished and
  aborted requests filtered, requests that do not fit paused, paused ones
  recovered every 100 iterations), a prefill chunk or a decode step
  (``prepare_*_inputs``: eviction and allocation; the linear cache's state
  buffers; ``_post_handle``), and every release through
  ``free_a_req_mem``. All of it is LightLLM's code; an exception it raises
  (its own asserts, as shipped) comes out of ``step``;
* after each step, the requests the infer side released become
  ``Outcome``s (finished, aborted as the workload asked, or ended by LightLLM
  unasked: failed), and every ``observers`` callable runs (the probe);
* ``flush()`` evicts every unreferenced tree token with the cache's own
  eviction, as an operator's flush would.

An exception LightLLM raises ends its loop, as it would end its infer process:
the run is judged on the state it left (``judged_where_it_broke``).

Invariant: the workload changes LightLLM's state only through ``submit``,
``abort``, ``step`` and ``flush`` (the cache's own eviction), as the router
and an operator's flush would.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kvwatch.targets.driver.engine_loop import ABORTED, FINISHED, EngineLoop, Outcome
from kvwatch.targets.lightllm.infer_build import InferParts
from kvwatch.targets.lightllm.infer_records import MultimodalParams, ShmReq, StopLoop

FAILED = "aborted-by-lightllm"  # LightLLM ended it unasked (FINISHED, ABORTED: the shared ones)


class _Kinds(NamedTuple):
    hash_list: type
    finish_status: type


class InferLoop(EngineLoop):
    engine = "LightLLM"
    step_word = "iteration"
    unasked = FAILED
    judged_where_it_broke = True

    def __init__(self, parts: InferParts) -> None:
        super().__init__()
        self.parts = parts
        self.iterations = 0
        self.requests: dict[int, ShmReq] = {}
        self.aborts: set[int] = set()
        self.waiting: list[tuple] = []  # new-request commands the slots do not take yet
        self._released = 0
        m = parts.modules
        self._kinds = _Kinds(hash_list=m.hl.TokenHashList, finish_status=m.objreq.FinishStatus)

    @property
    def steps(self) -> int:
        return self.iterations

    @property
    def linear(self) -> bool:
        return self.parts.cache == "linear"

    # -- the router's side ---------------------------------------------------------------------
    def submit(self, rid: int, prompt: list[int], max_new: int) -> ShmReq:
        index = len(self.parts.shm.reqs)
        page = self.parts.args.linear_att_hash_page_size if self.linear else 0
        record = ShmReq(
            index=index, rid=rid, prompt=prompt, max_new=max_new, page=page, kinds=self._kinds
        )
        self.parts.shm.reqs[index] = record
        self.requests[rid] = record
        self.waiting.append((rid, index, MultimodalParams(), 0))
        return record

    def abort(self, rid: int) -> None:
        self.aborts.add(rid)
        queued = [cmd for cmd in self.waiting if cmd[0] == rid]
        if queued:  # never sent: the router drops it
            self.waiting.remove(queued[0])
            self.outcomes.append(Outcome(rid=rid, status=ABORTED, step=self.iterations))
            return
        self.parts.io.cmds.append(self.parts.modules.io.AbortedReqCmd(req_id=rid))

    def _send(self) -> None:
        """Waiting requests into the IO buffer while request slots are free."""
        sent = sum(1 for cmd in self.parts.io.cmds if isinstance(cmd, tuple))
        free = self.parts.req_manager.req_list.can_alloc_size - sent
        while self.waiting and free > 0:
            self.parts.io.cmds.append(self.waiting.pop(0))
            free -= 1

    # -- the loop ------------------------------------------------------------------------------
    def step(self) -> None:
        """One iteration of LightLLM's ``infer_loop``; what it raises comes out."""
        self._send()
        self.parts.io.budget = 1
        try:
            self.parts.backend.infer_loop()
        except StopLoop:
            pass
        finally:
            self.iterations += 1
            self._note_released()
        self.notify()

    def _note_released(self) -> None:
        released = self.parts.shm.put_back
        for rid in released[self._released :]:
            self.outcomes.append(Outcome(rid=rid, status=self.status_of(rid), step=self.iterations))
        self._released = len(released)

    def status_of(self, rid: int) -> str:
        if rid in self.aborts:
            return ABORTED
        status = self.requests[rid].finish_status
        return FINISHED if status.is_stopped() or status.is_finished_length() else FAILED

    def failure(self, ended: Outcome) -> dict:
        error = f"LightLLM ended it at iteration {ended.step}"
        return {"name": f"request {ended.rid}", "status": 0, "error": error}

    def live(self) -> list[Any]:
        """LightLLM's live ``InferReq`` objects, running or paused."""
        return list(self.parts.ctx.requests_mapping.values())

    def idle(self) -> bool:
        return not (self.parts.ctx.requests_mapping or self.parts.io.cmds or self.waiting)

    def flush(self) -> bool:
        """Evict every unreferenced tree token with the cache's own eviction; False
        while requests are live."""
        if not self.idle():
            return False
        radix = self.parts.radix
        unreferenced = int(radix.get_tree_total_tokens_num() - radix.get_refed_tokens_num())
        if unreferenced > 0:
            free = int(self.parts.mem.allocator.can_use_mem_size)
            radix.free_radix_cache_to_get_enough_token(free + unreferenced)
        return True
