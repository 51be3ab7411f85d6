"""The scheduler shim for 0.5.4.post3 .. 0.5.13.post1: their ``Scheduler``'s cache calls, in order.

One ``step()`` is one iteration of ``event_loop_normal`` (no overlap)::

    [waiting_timeout] _abort_on_waiting_timeout: drop, free nothing (as SGLang does)
    get_next_batch_to_run:
        chunked_req: tree_cache.cache_unfinished_req(chunked=True)          (stash)
                     [stash_frees_req_slot: then req_to_token_pool.free(row)]
        last batch was extend: filter_batch(chunked excluded), merge into running
        get_new_batch_prefill:
            PrefillAdder(...); chunked_req.init_next_round_input(); add_chunked_req
            per waiting req: req.init_next_round_input(tree_cache)   (match_prefix,
                               mamba copy-on-write)
                             adder.add_one_req(req)                 (inc_lock_ref, budget)
                             rejected: [revert_mamba_on_reject] free the copied mamba slot
            ScheduleBatch.init_new(...).prepare_for_extend()        (alloc_for_extend)
        else update_running_batch: filter_batch; check_decode_mem() or a forced
            retraction -> retract_decode (release_req, evict, reset_for_retract) ->
            back to the queue; prepare_for_decode() (or spec-v2 over-allocation)
    forward: a random token per request (spec: 1 + random accepted drafts)
    process_batch_result_prefill / _decode: output_ids += tokens; check_finished
        (update_finish_state from 0.5.13); finished -> release_kv_cache
        [release_kv_cache trait; before: tree_cache.cache_finished_req];
        unfinished prefill -> cache_unfinished_req; a middle chunk -> is_chunked -= 1
    [deferred_session_close] session_controller.maybe_reap(now=step number)

``abort(rid)`` is ``abort_request`` (rid prefix match): a queued request leaves
the queue ([queued_abort_*] giving back a mamba slot its match copied), a
running or mid-prefill one gets ``to_finish = FINISH_ABORT()``. Each bracketed
difference is a trait read from the release's files (``scheduler_traits``).

Where this differs from SGLang's scheduler: no overlap, mixed chunked
prefill, PP / DP / disaggregation / grammar / LoRA / HiCache; FCFS order;
spec decoding is ``draft_decode.DraftInput``; the waiting timeout counts
steps; ``retract_every`` stands in for ``SGLANG_TEST_RETRACT``.
"""

from __future__ import annotations

from array import array
from typing import Any

import torch

from kvwatch.targets.sglang import draft_decode, kv_pools, scheduler_traits, tree_caches
from kvwatch.targets.sglang.host_modules import ServerArgs, ServerArgsHolder
from kvwatch.targets.sglang.release_import import Release
from kvwatch.targets.sglang.shim_parts import (
    ABORTED,
    ABORTED_BY_SGLANG,
    ABORTED_IN_QUEUE,
    FINISHED,
    TIMED_OUT,
    Incoming,
    ModelConfig,
    Params,
    ShimConfig,
    ShimLoop,
    call_offered,
)
from kvwatch.targets.sglang.stand_ins import defines


def server_args(config: ShimConfig) -> ServerArgs:
    args = ServerArgs(page_size=config.pools.page_size)
    if config.spec is not None:
        args.speculative_algorithm = "EAGLE"
        args.speculative_num_steps = config.spec.num_steps
        args.speculative_eagle_topk = config.spec.topk
        args.speculative_num_draft_tokens = config.spec.num_draft_tokens
        args.max_speculative_num_draft_tokens = config.spec.num_draft_tokens
    return args


class LegacyScheduler(ShimLoop):
    def __init__(self, release: Release, config: ShimConfig, seed: int = 0) -> None:
        super().__init__(config, seed)
        self.release = release
        self.traits = scheduler_traits.read(release.root)
        self.sb = release.module("schedule_batch")
        self.policy = release.module("schedule_policy")
        self.common = release.module("common")
        ServerArgsHolder.current = self.server_args = server_args(config)
        self.pools = kv_pools.build(release, config.pools)
        self.tree_cache = tree_caches.build(release, self.pools, streaming=config.streaming)
        if release.has("session_controller"):
            controller = getattr(release.module("session_controller"), "SessionController", None)
            if controller is not None:  # 0.5.10+
                self.sessions = controller(self.tree_cache)
        self.algorithm = draft_decode.Algorithm(config.spec is not None)
        self.enable_overlap = config.spec is not None  # spec v2 is the overlap path
        self.running_batch = self.sb.ScheduleBatch(reqs=[], batch_is_full=False)
        # 0.5.13 renamed the chunk counter and moved token ids to array("q")
        self.chunks = (
            "inflight_middle_chunks" if self.traits.inflight_middle_chunks else "is_chunked"
        )
        self.ids = (lambda ids: array("q", ids)) if self.traits.array_tokens else list

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
        """``handle_generate_request``: a new request, or a session's next turn, queued."""
        params = Params(max_new_tokens)
        vocab = ModelConfig.vocab_size
        if session_id is None:
            req = call_offered(
                self.sb.Req, rid, None, self.ids(input_ids), params, vocab_size=vocab
            )
        else:
            registry = self.sessions
            if hasattr(registry, "get"):
                session = registry.get(session_id)
            else:
                session = registry.sessions[session_id]
            ask = Incoming(
                rid=rid,
                input_ids=self.ids(input_ids),
                sampling_params=params,
                stream=False,
                session_params=Incoming(id=session_id),
                return_logprob=False,
                top_logprobs_num=0,
            )
            req = call_offered(session.create_req, ask, None, vocab_size=vocab)
        req.tokenizer = None
        req.logprob_start_len = -1  # return_logprob is off
        self.queue(req)
        return req

    def abort(self, rid: str) -> None:
        """``abort_request`` for one rid (a prefix match, as SGLang does)."""
        self.notify()  # what the request holds, just before
        self.asked_aborts.append(rid)
        for req in [r for r in self.waiting_queue if r.rid.startswith(rid)]:
            self.waiting_queue.remove(req)
            self.ended(req.rid, ABORTED_IN_QUEUE)
            if req.mamba_pool_idx is None:
                continue
            if self.traits.queued_abort_release_kv:
                self.common.release_kv_cache(req, self.tree_cache, is_insert=False)
            elif self.traits.queued_abort_cache_finished:
                self.tree_cache.cache_finished_req(req, is_insert=False)
        for req in self.running_requests():
            if req.rid.startswith(rid) and not req.finished():
                req.to_finish = self.sb.FINISH_ABORT()

    # -- the event loop --------------------------------------------------------------------
    def step(self) -> bool:
        """One scheduler iteration; False when there was nothing to run."""
        self.step_no += 1
        if self.traits.waiting_timeout and self.config.waiting_timeout_steps is not None:
            self.notify()
            for req in self.late():  # _abort_on_waiting_timeout
                self.waiting_queue.remove(req)
                self.ended(req.rid, TIMED_OUT)
        batch, kind = self._next_batch()
        if batch is not None:
            if kind == "extend":
                self._process_prefill(batch)
            else:
                self._process_decode(batch)
        self.last_batch, self.last_kind = batch, kind
        if self.sessions is not None and self.traits.deferred_session_close:
            # a clock that moves: SGLang reaps only when now - last reap > interval
            call_offered(self.sessions.maybe_reap, now=float(self.step_no), interval=0.0)
        self.notify()
        return batch is not None

    def _stash_chunked(self) -> None:
        req = self.chunked_req
        self.tree_cache.cache_unfinished_req(req, chunked=True)
        if self.traits.stash_frees_req_slot:
            pool = self.pools.req_to_token_pool
            if self.pools.mamba_pool is not None:
                pool.free(req.req_pool_idx, free_mamba_cache=False)
            else:
                pool.free(req.req_pool_idx)

    def _merge_last_extend(self, exclude: list[Any]) -> None:
        last = self.last_batch
        if last.chunked_req is not None:
            exclude.append(last.chunked_req)
        before = last.batch_size()
        last.filter_batch(chunked_req_to_exclude=exclude)
        if last.batch_size() < before:
            self.running_batch.batch_is_full = False
        if last.is_empty():
            return
        if self.running_batch.is_empty():
            self.running_batch = last
        else:
            self.running_batch.merge_batch(last)

    def _next_batch(self) -> tuple[Any, str | None]:
        exclude = []
        if self.chunked_req is not None:
            exclude.append(self.chunked_req)
            self._stash_chunked()
        if self.last_batch is not None and self.last_kind == "extend":
            self._merge_last_extend(exclude)
        new_batch = self._new_prefill_batch()
        if new_batch is not None:
            return new_batch, "extend"
        if not self.running_batch.is_empty():
            self.running_batch = self._update_running_batch(self.running_batch)
            if not self.running_batch.is_empty():
                return self.running_batch, "decode"
        return None, None

    def _allocatable(self) -> int:
        return self.config.max_running_requests - len(self.running_batch.reqs)

    def _adder(self) -> Any:
        cfg = self.config
        return call_offered(
            self.policy.PrefillAdder,
            cfg.pools.page_size,
            self.tree_cache,
            self.pools.allocator,
            self.running_batch,
            self.new_token_ratio,
            cfg.max_prefill_tokens,
            cfg.chunked_prefill_size,
            0,
            max_running_requests=cfg.max_running_requests,
        )

    def _admit(self, adder: Any) -> None:
        """Match and add waiting requests until the adder stops taking them."""
        running, result = self.running_batch, self.policy.AddReqResult
        for req in self.waiting_queue:
            if len(adder.can_run_list) >= self._allocatable():
                running.batch_is_full = True
            if running.batch_is_full:
                break
            req.init_next_round_input(self.tree_cache)
            res = call_offered(
                adder.add_one_req,
                req,
                has_chunked_req=self.chunked_req is not None,
                truncation_align_size=None,
            )
            if res == result.CONTINUE:
                continue
            if res == result.NO_TOKEN:
                running.batch_is_full = True
            added = bool(adder.can_run_list) and req is adder.can_run_list[-1]
            if self.traits.revert_mamba_on_reject and not added and req.mamba_pool_idx is not None:
                self.pools.mamba_slots.free(req.mamba_pool_idx.unsqueeze(-1))
                req.mamba_pool_idx = None
            break

    def _new_prefill_batch(self) -> Any:
        running = self.running_batch
        if (running.batch_is_full or not self.waiting_queue) and self.chunked_req is None:
            return None
        if self._allocatable() <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        adder = self._adder()
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        self._admit(adder)
        if not adder.can_run_list:
            return None
        chosen = {id(r) for r in adder.can_run_list}
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in chosen]
        for req in adder.preempt_list:
            self.queue(req)
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            setattr(self.chunked_req, self.chunks, getattr(self.chunked_req, self.chunks) + 1)
        return self._extend_batch(adder.can_run_list)

    def _extend_batch(self, can_run: list[Any]) -> Any:
        batch = call_offered(
            self.sb.ScheduleBatch.init_new,
            can_run,
            self.pools.req_to_token_pool,
            self.pools.allocator,
            self.tree_cache,
            ModelConfig(),
            self.enable_overlap,
            self.algorithm,
            chunked_req=self.chunked_req,
        )
        if self.config.spec is not None:
            batch.spec_info = draft_decode.DraftInput(self.common, self._alloc_len_per_decode())
        batch.prepare_for_extend()
        batch.decoding_reqs = None
        return batch

    def _alloc_len_per_decode(self) -> int:
        utils = self.release.module("manager_utils") if self.release.has("manager_utils") else None
        if utils is not None and hasattr(utils, "get_alloc_len_per_decode"):
            return utils.get_alloc_len_per_decode(self.server_args)
        spec = self.config.spec
        return max(spec.num_steps * spec.topk, spec.num_draft_tokens)

    def _retract(self, batch: Any) -> None:
        answer = batch.retract_decode(self.server_args)
        retracted, self.new_token_ratio = answer[0], answer[1]
        for req in answer[2] if len(answer) > 2 else []:
            self.ended(req.rid, ABORTED_BY_SGLANG)
        self.retractions += len(retracted)
        for req in retracted:
            self.queue(req)

    def _update_running_batch(self, batch: Any) -> Any:
        initial = batch.batch_size()
        call_offered(batch.filter_batch, v1_spec_info_filtered=True)
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
        if not batch.is_empty():
            batch.prepare_for_decode()
        return batch

    # -- results ---------------------------------------------------------------------------
    def _check_finished(self, req: Any, accepted: int = 1) -> None:
        """``Req.check_finished`` (``update_finish_state`` from 0.5.13)."""
        if defines(type(req), "update_finish_state"):
            req.update_finish_state(accepted)
        else:
            req.check_finished(accepted)

    def _finish(self, req: Any) -> None:
        if self.traits.release_kv_cache:
            self.common.release_kv_cache(req, self.tree_cache)
        else:
            self.tree_cache.cache_finished_req(req)
        status = FINISHED
        if isinstance(req.finished_reason, self.sb.FINISH_ABORT):
            status = ABORTED if self.asked_to_abort(req.rid) else ABORTED_BY_SGLANG
        self.ended(req.rid, status)

    def _forward(self, batch: Any) -> list[int]:
        """The model: a random token per request, kept as ``batch.output_ids``."""
        tokens = [self.token() for _ in batch.reqs]
        batch.output_ids = torch.tensor(tokens, dtype=torch.int64)
        return tokens

    def _process_prefill(self, batch: Any) -> None:
        for req, token in zip(batch.reqs, self._forward(batch), strict=True):
            if req.finished() or req.is_retracted:
                continue
            if getattr(req, self.chunks) > 0:  # a middle chunk
                setattr(req, self.chunks, getattr(req, self.chunks) - 1)
                continue
            req.output_ids.append(token)
            self._check_finished(req)
            if req.finished():
                self._finish(req)
            else:
                self.tree_cache.cache_unfinished_req(req)

    def _process_decode(self, batch: Any) -> None:
        spec = self.config.spec
        for req, token in zip(batch.reqs, self._forward(batch), strict=True):
            if req.finished() or req.is_retracted:
                continue
            if spec is None:
                req.output_ids.append(token)
                self._check_finished(req)
            else:
                n = draft_decode.accept(self.rng, spec)
                req.kv_committed_len += n
                req.output_ids.extend([*(self.token() for _ in range(n - 1)), token])
                self._check_finished(req, n)
            if req.finished():
                self._finish(req)
        if spec is not None:
            lens = [r.kv_committed_len for r in batch.reqs]
            batch.seq_lens = torch.tensor(lens, dtype=torch.int64)
            batch.seq_lens_cpu = batch.seq_lens.clone()
