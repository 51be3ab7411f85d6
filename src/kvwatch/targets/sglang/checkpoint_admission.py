"""The checkpoint shim's admission: ``get_new_batch_prefill`` of 0.5.22+, in its order.

``CheckpointAdmission`` is a part of ``checkpoint_shim.CheckpointScheduler``
(its base class, with no state of its own): the chunked request first, then
each waiting request through SGLang's own ``PrefillAdder`` (its
``PrefillBudget``) inside the mamba allocator's group, a rejected request
giving back the deferred mamba copy and, outside a session, the slot its match
copied; the chosen ones become a ``ScheduleBatch`` prepared for extend. It
reads and sets the scheduler's ``config``, ``pools``, ``tree_cache``,
``policy``, ``sb``, ``running_batch``, ``waiting_queue``, ``chunked_req``,
``new_token_ratio``, ``algorithm`` and ``enable_overlap``, and queues again
through ``queue``; it imports nothing from SGLang.

Invariant: a request leaves the waiting queue only when the adder took it; one
the adder preempted goes back to it.
"""

from __future__ import annotations

from typing import Any

from kvwatch.targets.sglang.shim_parts import ModelConfig, call_offered


class CheckpointAdmission:
    """``get_new_batch_prefill``: the waiting requests admitted into a prefill batch."""

    def _allocatable(self, held_rows: int = 0) -> int:
        """``get_num_allocatable_reqs``: the batch cap and the free rows."""
        rows = self.pools.req_to_token_pool.available_size() + held_rows
        return min(self.config.max_running_requests - len(self.running_batch.reqs), rows)

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
            waiting_queue_len=len(self.waiting_queue),
        )

    def _rejected(self, req: Any) -> None:
        """A request the adder did not take gives back the deferred mamba copy and,
        outside a session, the slot its match copied."""
        req.kv.mamba_cow_src_index = None
        req.kv.mamba_needs_clear = False
        if req.kv.holds_mamba and not getattr(req, "session", None):
            self.tree_cache.req_to_token_pool.mamba_allocator.free(
                req.kv.mamba_pool_idx.unsqueeze(-1)
            )
            req.kv.mamba_pool_idx = None

    def _admit(self, adder: Any) -> None:
        running, result = self.running_batch, self.policy.AddReqResult
        for req in self.waiting_queue:
            if adder.budget_state() == result.OTHER:
                break
            held = sum(r.kv.holds_kv for r in adder.can_run_list)
            if len(adder.can_run_list) >= self._allocatable(held):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            req.init_next_round_input(self.tree_cache)
            res = adder.add_one_req(
                req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None
            )
            if res == result.CONTINUE:
                continue
            if res == result.NO_TOKEN:
                running.batch_is_full = bool(adder.can_run_list) or not running.is_empty()
            if not (adder.can_run_list and req is adder.can_run_list[-1]):
                self._rejected(req)
            break

    def _new_prefill_batch(self) -> Any:
        running = self.running_batch
        if running.is_empty():
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting_queue) and self.chunked_req is None:
            return None
        if self._allocatable() <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        adder = self._adder()
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        mamba = getattr(self.pools.req_to_token_pool, "mamba_allocator", None)
        if mamba is not None:
            mamba.alloc_group_begin(len(self.waiting_queue))
        self._admit(adder)
        if mamba is not None:
            mamba.alloc_group_end()
        can_run = adder.can_run_list
        if can_run:
            chosen = {id(r) for r in can_run}
            self.waiting_queue = [r for r in self.waiting_queue if id(r) not in chosen]
        for req in adder.preempt_list:
            self.queue(req)
        if not can_run:
            return None
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        return self._extend_batch(can_run)

    def _extend_batch(self, can_run: list[Any]) -> Any:
        batch = self.sb.ScheduleBatch.init_new(
            can_run,
            self.pools.req_to_token_pool,
            self.pools.allocator,
            self.tree_cache,
            ModelConfig(),
            self.enable_overlap,
            self.algorithm,
            chunked_req=self.chunked_req,
        )
        batch.contains_last_prefill_chunk = self.chunked_req is None or len(can_run) != 1
        batch.prepare_for_extend()
        batch.decoding_reqs = None
        return batch
