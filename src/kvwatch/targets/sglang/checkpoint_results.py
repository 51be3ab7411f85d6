"""The checkpoint shim's results: ``process_batch_result_prefill`` / ``_decode`` of 0.5.22+.

``CheckpointResults`` is a part of ``checkpoint_shim.CheckpointScheduler``
(its base class, with no state of its own): each request of a batch gets the
model's tokens (random; with speculative decoding, ``1 +`` drawn accepted
drafts, its committed length moved as ``_resolve_spec_v2_tokens`` moves it);
a finished request is released with ``release_kv_cache(checkpoint=True)``, an
unfinished prefill checkpointed, a middle chunk only counted down. On a mamba
tree after a spec step the finished request's state is donated only at its
committed length (``_can_cache_finished``, re-stated from SGLang). It reads
the scheduler's ``config``, ``common``, ``sb``, ``tree_cache`` and ``rng``,
draws tokens with ``token`` and reports each end through ``ended`` (who asked:
``asked_to_abort``).

Invariant: every request that finishes here is released exactly once, and its
outcome names who ended it (the client's abort, or SGLang's own).
"""

from __future__ import annotations

from typing import Any

import torch

from kvwatch.targets.sglang import draft_decode
from kvwatch.targets.sglang.shim_parts import ABORTED, ABORTED_BY_SGLANG, FINISHED


class CheckpointResults:
    """A batch's results applied as the release's scheduler applies them."""

    def _finish(self, req: Any) -> None:
        self.common.release_kv_cache(req, self.tree_cache, checkpoint=True)
        status = FINISHED
        if isinstance(req.finished_reason, self.sb.FINISH_ABORT):
            status = ABORTED if self.asked_to_abort(req.rid) else ABORTED_BY_SGLANG
        self.ended(req.rid, status)

    def _process_prefill(self, batch: Any) -> None:
        for req in batch.reqs:
            token = self.token()
            if (req.finished() and req.inflight_middle_chunks <= 0) or req.is_retracted:
                continue
            if req.inflight_middle_chunks > 0:  # a middle chunk
                req.inflight_middle_chunks -= 1
                continue
            req.output_ids.append(token)
            req.update_finish_state()
            if req.finished():
                self._finish(req)
            else:
                self.common.checkpoint_kv_cache(req, self.tree_cache)
        if self.config.spec is not None:
            batch.spec_info = draft_decode.DraftInput()

    def _can_cache_finished(self, req: Any) -> bool:
        """``_mamba_can_cache_finished_req``: after a spec step on a mamba tree the live
        state may be donated only when it is exactly the committed length."""
        tracked = req.kv.mamba_ping_pong_track_buffer is not None
        if tracked or not self.tree_cache.supports_mamba():
            return True
        return req.owned_kv_len() == req.kv.kv_committed_len

    def _process_decode(self, batch: Any) -> None:
        spec = self.config.spec
        for req in batch.reqs:
            if spec is None:
                run = [self.token()]
            else:
                run = [self.token() for _ in range(draft_decode.accept(self.rng, spec))]
                if not (req.is_retracted or req.finished()):
                    req.kv.kv_committed_len += len(run)  # _resolve_spec_v2_tokens
            req.output_ids.extend(run)
            req.update_finish_state(len(run))
            if req.finished():
                if spec is not None and not self._can_cache_finished(req):
                    req.skip_radix_cache_insert = True
                self._finish(req)
        if spec is not None:
            lens = [r.kv.kv_committed_len for r in batch.reqs]
            batch.seq_lens = torch.tensor(lens, dtype=torch.int64)
            batch.seq_lens_cpu = batch.seq_lens.clone()
