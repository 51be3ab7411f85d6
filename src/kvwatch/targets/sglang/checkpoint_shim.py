"""The scheduler shim for the "checkpoint" releases (0.5.22+): their ``Scheduler``'s cache calls, in order.

These releases reworked the request/cache contract: a request's KV record
is a ``ReqKvInfo`` (``req.kv``); it holds a ``TreeLock`` (``req.lock``) on its
prefix; the scheduler publishes running requests with
``common.checkpoint_kv_cache`` and releases them with
``common.release_kv_cache(req, tree, checkpoint=...)``; every model's cache
is a ``UnifiedRadixCache`` that owns the ``StreamingSession`` records;
admission goes through the allocator's ``PrefillBudget``; aborts and waiting
timeouts go through one ``abort_request``. One ``step()`` is one iteration of
``event_loop_normal`` (0.5.23 ``managers/scheduler.py``)::

    process_input_requests: session_controller.maybe_reap(now=step number)
                            _poll_timeout_aborts -> abort_request
    get_next_batch_to_run:
        process_pending_chunked_abort: _release_aborted_request,
            release_kv_cache(checkpoint=False), chunked_req = None
        chunked_req: stash_chunked_request -> checkpoint_kv_cache (if it extended)
        last batch was extend: filter_batch(exclude chunked), merge into running
        running_batch.filter_batch()
        get_new_batch_prefill: PrefillAdder (create_prefill_budget); the chunked
            request first; mamba_allocator.alloc_group_begin; per waiting req:
            init_next_round_input(tree) (session slot lend, or tree match + mamba
            copy-on-write), add_one_req (req.lock = tree.lock(last_node)); rejected:
            clear the deferred copy, [no session] free the mamba slot; break;
            alloc_group_end; ScheduleBatch.init_new(...).prepare_for_extend()
        else update_running_batch: filter_batch; check_decode_mem() or a forced
            retraction -> retract_decode (release_req: release_kv_cache(checkpoint=
            False), evict, reset_for_retract) -> back to the queue; prepare_for_decode
            (alloc_for_decode, or the release's eagle_prepare_for_decode)
    forward: random tokens (spec: 1 + random accepted drafts)
    process_batch_result_prefill / _decode inside allocator.free_group_begin/end:
        output_ids += tokens; update_finish_state(); finished -> release_kv_cache(
        checkpoint=True); unfinished prefill -> checkpoint_kv_cache; a middle chunk
        -> inflight_middle_chunks -= 1

``abort(rid)`` is ``abort_request(AbortReq(rid))`` (rid prefix match): the
chunked request is marked for ``process_pending_chunked_abort``; a queued one
is popped, ``_release_aborted_request`` (``tree.finish(handle, ABORT)``,
``session.abort_req()``) and, holding a mamba slot, ``release_kv_cache``;
running ones get ``to_finish = FINISH_ABORT()``.

Where this differs from SGLang: no overlap, mixed chunked prefill, PP / DP /
disaggregation / grammar / LoRA / HiCache or priority scheduling; FCFS order;
spec decoding's drafts are drawn (``draft_decode.accept``); the waiting timeout counts
steps; ``retract_every`` stands in for ``SGLANG_TEST_RETRACT``;
``init_req_max_new_tokens`` and ``calc_priority`` are not called; spec
decoding runs without overlap (the release supports that); the mamba
"can cache finished req" rule is re-stated (``_can_cache_finished``).

This module holds the requests, the sessions, the aborts and the loop's
order; admission (``get_new_batch_prefill``) is ``checkpoint_admission.py``
and the batches' results ``checkpoint_results.py``, both base classes of
``CheckpointScheduler`` with no state of their own.
"""

from __future__ import annotations

from array import array
from typing import Any

from kvwatch.targets.sglang import (
    draft_decode,
    kv_pools,
    runtime_settings,
    scheduler_traits,
    tree_caches,
)
from kvwatch.targets.sglang.checkpoint_admission import CheckpointAdmission
from kvwatch.targets.sglang.checkpoint_results import CheckpointResults
from kvwatch.targets.sglang.release_import import Release
from kvwatch.targets.sglang.shim_parts import (
    ABORTED,
    ABORTED_BY_SGLANG,
    ABORTED_IN_QUEUE,
    TIMED_OUT,
    Incoming,
    ModelConfig,
    Params,
    ShimConfig,
    ShimLoop,
    call_offered,
)

WAITING_TIMEOUT = "Request waiting timeout reached."


class CheckpointScheduler(CheckpointAdmission, CheckpointResults, ShimLoop):
    def __init__(self, release: Release, config: ShimConfig, seed: int = 0) -> None:
        super().__init__(config, seed)
        self.release = release
        self.traits = scheduler_traits.read(release.root)
        self.sb = release.module("schedule_batch")
        self.policy = release.module("schedule_policy")
        self.common = release.module("common")
        runtime_settings.Holder.current = runtime_settings.run_settings(release.root, config)
        self.pools = kv_pools.build(release, config.pools)
        self.tree_cache = tree_caches.build(
            release, self.pools, streaming=config.streaming, spec=config.spec is not None
        )
        self.sessions = release.cls("session_controller")(self.tree_cache)
        self.algorithm = draft_decode.Algorithm(config.spec is not None)
        self.enable_overlap = False
        self.running_batch = self.sb.ScheduleBatch(reqs=[], batch_is_full=False)
        self.pending_chunked_abort: Any = None
        io_struct = release.root / "sglang" / "srt" / "managers" / "io_struct.py"
        self.req_defaults = runtime_settings.class_defaults(io_struct, "TokenizedGenerateReqInput")
        self.session_defaults = runtime_settings.class_defaults(io_struct, "SessionParams")

    # -- requests and sessions -------------------------------------------------------------
    def open_session(self, session_id: str) -> None:
        streaming = self.config.streaming
        self.sessions.open(
            Incoming(session_id=session_id, capacity_of_str_len=1 << 20, streaming=streaming)
        )

    def close_session(self, session_id: str) -> None:
        self.sessions.close(Incoming(session_id=session_id))

    def submit(
        self, rid: str, input_ids: list[int], max_new_tokens: int, session_id: str | None = None
    ) -> Any:
        """``handle_generate_request``: a request, or a streaming session's next turn, queued."""
        params, ids = Params(max_new_tokens), array("q", input_ids)
        vocab = ModelConfig.vocab_size
        if session_id is None:
            req = call_offered(self.sb.Req, rid, None, ids, params, vocab_size=vocab)
        else:
            ask = Incoming(
                **{
                    **self.req_defaults,
                    "rid": rid,
                    "input_ids": ids,
                    "sampling_params": params,
                    "stream": False,
                    "session_params": Incoming(**{**self.session_defaults, "id": session_id}),
                    "return_logprob": False,
                    "top_logprobs_num": 0,
                }
            )
            session = self.sessions.get(session_id)
            req = call_offered(session.create_req, ask, None, vocab, req_factory=self.sb.Req)
        req.tokenizer = None
        req.logprob_start_len = -1
        self.queue(req)
        return req

    def _release_aborted_request(self, req: Any) -> None:
        req.release_mm_inputs_on_abort()
        outcome = self.release.module("base").CacheRequestOutcome.ABORT
        self.tree_cache.finish(req.cache_request_handle, outcome)
        if req.session is not None and req.session.streaming:
            req.session.abort_req()

    def abort(self, rid: str, *, timed_out: bool = False) -> None:
        """``abort_request(AbortReq(rid))``: the client's, or the waiting timeout's."""
        self.notify()
        self.asked_aborts.append(rid)
        if self.chunked_req is not None and self.chunked_req.rid.startswith(rid):
            self.pending_chunked_abort = self.chunked_req
        for req in [r for r in self.waiting_queue if r.rid.startswith(rid)]:
            self.waiting_queue.remove(req)
            self._release_aborted_request(req)
            self.ended(req.rid, TIMED_OUT if timed_out else ABORTED_IN_QUEUE)
            if req.kv.holds_mamba:
                self.common.release_kv_cache(req, self.tree_cache, checkpoint=False)
        for req in self.running_requests():
            if not req.finished() and req.rid.startswith(rid):
                reason = self.sb.FINISH_ABORT(WAITING_TIMEOUT) if timed_out else None
                req.to_finish = reason or self.sb.FINISH_ABORT()

    # -- the event loop --------------------------------------------------------------------
    def step(self) -> bool:
        self.step_no += 1
        # a clock that moves: SGLang reaps only when now - last reap > interval
        call_offered(self.sessions.maybe_reap, now=float(self.step_no), interval=0.0)
        for rid in [r.rid for r in self.late()]:  # _poll_timeout_aborts
            self.abort(rid, timed_out=True)
        batch, kind = self._next_batch()
        if batch is not None:
            allocator = self.pools.allocator
            allocator.free_group_begin()
            try:
                if kind == "extend":
                    self._process_prefill(batch)
                else:
                    self._process_decode(batch)
            finally:
                allocator.free_group_end()
        self.last_batch, self.last_kind = batch, kind
        self.after_step(batch is not None)
        return batch is not None

    def _process_pending_chunked_abort(self) -> None:
        req, self.pending_chunked_abort = self.pending_chunked_abort, None
        if req is None:
            return
        if self.chunked_req is not req:
            if not (req.finished() or not req.kv.holds_kv):
                self.abort(req.rid)
            return
        req.finished_reason = self.sb.FINISH_ABORT("Aborted")  # prepare_abort
        req.to_finish = None
        self._release_aborted_request(req)
        self.common.release_kv_cache(req, self.tree_cache, checkpoint=False)
        self.chunked_req = None
        self.ended(req.rid, ABORTED)

    def _merge_last_extend(self, running: Any, exclude: list[Any]) -> Any:
        last = self.last_batch
        if last.chunked_req is not None:
            exclude.append(last.chunked_req)
        before = last.batch_size()
        last.filter_batch(reqs_to_exclude=exclude)
        if last.batch_size() < before:
            running.batch_is_full = False
        if last.is_empty() or last is running:
            return running
        if running.is_empty():
            return last
        running.merge_batch(last)
        return running

    def _next_batch(self) -> tuple[Any, str | None]:
        self._process_pending_chunked_abort()
        exclude = []
        chunked = self.chunked_req
        if chunked is not None:
            exclude.append(chunked)
            if chunked.extend_end > chunked.prefix_len:  # stash_chunked_request
                self.common.checkpoint_kv_cache(chunked, self.tree_cache)
        running = self.running_batch
        if self.last_batch is not None and self.last_kind == "extend":
            running = self._merge_last_extend(running, exclude)
        before = running.batch_size()
        running.filter_batch()
        if running.batch_size() < before:
            running.batch_is_full = False
        self.running_batch = running
        new_batch = self._new_prefill_batch()
        if new_batch is not None:
            return new_batch, "extend"
        if not self.running_batch.is_empty():
            decode = self._update_running_batch(self.running_batch)
            if decode is not None and not decode.is_empty():
                return decode, "decode"
        return None, None

    def _retract(self, batch: Any) -> None:
        retracted, self.new_token_ratio, to_abort = batch.retract_decode()
        for req in to_abort:
            self.ended(req.rid, ABORTED_BY_SGLANG)
        self.retractions += len(retracted)
        for req in retracted:
            self.queue(req)

    def _update_running_batch(self, batch: Any) -> Any:
        initial = batch.batch_size()
        batch.filter_batch(reqs_to_exclude=[])
        if batch.is_empty():
            batch.batch_is_full = False
            return batch
        self.decode_steps += 1
        every = self.config.retract_every
        if not batch.check_decode_mem() or (every and self.decode_steps % every == 0):
            self._retract(batch)
        else:
            decayed = self.new_token_ratio - self.config.new_token_ratio_decay
            self.new_token_ratio = max(decayed, self.config.min_new_token_ratio)
        if batch.batch_size() < initial:
            batch.batch_is_full = False
        if batch.is_empty():
            return batch
        if self.config.spec is not None and not batch.spec_info:
            batch.spec_info = draft_decode.DraftInput()  # the worker's draft input
        batch.prepare_for_decode()
        return batch
