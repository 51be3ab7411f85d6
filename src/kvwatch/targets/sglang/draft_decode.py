"""Speculative decoding without a draft model: what EAGLE's "spec v2" does to the pools.

SGLang's spec-v2 decode step over-allocates: before each decode step every
request is topped up to ``kv_committed_len + 2 * alloc_len_per_decode``
allocated slots, and the verify step commits ``1 + accepted drafts`` of
them. ``allocated - committed`` is what a finished request has
over-allocated, which ``common.release_kv_cache`` frees except on paths that
skip it (seed 001: a streaming session's next turn writes over it).

* Before 0.5.22 the release's own step (``speculative/eagle_info_v2.py``)
  cannot be imported on a CPU host (model runner, CUDA kernels), so
  ``DraftInput.prepare_for_decode`` does what it does to the pools, with the
  release's own allocation helpers (``common.alloc_token_slots`` or
  ``alloc_paged_token_slots_extend``).
* From 0.5.22 ``ScheduleBatch.prepare_for_decode`` calls
  ``spec_utils.spec_prepare_for_decode``, which for EAGLE runs the release's
  own ``eagle_utils.eagle_prepare_for_decode``: that one is imported for real;
  only the dispatcher module (it runs ``torch.compile`` at import) is
  replaced, by ``spec_utils_module``.

``accept`` draws how many tokens one verify step commits (the bonus token
and 0..num_steps accepted drafts); ``Algorithm`` stands in for
``SpeculativeAlgorithm`` (EAGLE or none).
"""

from __future__ import annotations

import importlib
import random
from typing import Any

import torch

from kvwatch.targets.sglang.shim_parts import SpecConfig
from kvwatch.targets.sglang.stand_ins import StubModule


class Algorithm:
    """``SpeculativeAlgorithm``'s predicates: EAGLE when ``eagle``, else none."""

    def __init__(self, eagle: bool) -> None:
        self.eagle = eagle

    def is_none(self) -> bool:
        return not self.eagle

    def is_eagle(self) -> bool:
        return self.eagle

    def supports_spec_v2(self) -> bool:
        return self.eagle

    def __getattr__(self, name: str) -> Any:
        if name.startswith("is_"):
            return lambda: False
        raise AttributeError(name)


class DraftInput:
    """The batch's ``spec_info``: before 0.5.22, spec-v2 over-allocation before
    each decode step; from 0.5.22 only its place in the batch (the release's
    own code allocates)."""

    def __init__(self, common: Any, alloc_len_per_decode: int) -> None:
        self.common, self.alloc_len = common, alloc_len_per_decode
        self.verify_done = None

    def prepare_for_decode(self, batch: Any) -> None:
        reqs = batch.reqs
        cur = [r.kv_allocated_len for r in reqs]
        grow = [r.kv_committed_len + 2 * self.alloc_len - r.kv_allocated_len for r in reqs]
        for r, x in zip(reqs, grow, strict=True):
            r.kv_allocated_len += x
            r.decode_batch_idx += 1
        nxt = [c + x for c, x in zip(cur, grow, strict=True)]
        out = self._allocate(batch, cur, nxt, sum(grow))
        table = batch.req_to_token_pool.req_to_token
        at = 0
        for r, c, n in zip(reqs, cur, nxt, strict=True):  # assign_req_to_token_pool
            table[r.req_pool_idx, c:n] = out[at : at + n - c].to(torch.int32)
            at += n - c
        batch.seq_lens_cpu = batch.seq_lens.cpu()
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum().item())

    def _allocate(self, batch: Any, cur: list[int], nxt: list[int], need: int) -> Any:
        tree = batch.tree_cache
        if tree.page_size == 1:
            return self.common.alloc_token_slots(tree, need)
        table = batch.req_to_token_pool.req_to_token
        rows = [r.req_pool_idx for r in batch.reqs]
        last = [int(table[row, c - 1]) if c > 0 else -1 for row, c in zip(rows, cur, strict=True)]
        cur_t, nxt_t = torch.tensor(cur), torch.tensor(nxt)
        return self.common.alloc_paged_token_slots_extend(
            tree, cur_t, cur_t, nxt_t, nxt_t, torch.tensor(last), need
        )

    def filter_batch(self, new_indices: Any = None, has_been_filtered: bool = False, **_: Any):
        pass

    def merge_batch(self, other: Any) -> None:
        pass


def spec_utils_module(name: str) -> StubModule:
    """``sglang.srt.speculative.spec_utils`` with its decode dispatcher (EAGLE only)."""

    def spec_prepare_for_decode(batch: Any) -> None:
        eagle = importlib.import_module("sglang.srt.speculative.eagle_utils")
        eagle.eagle_prepare_for_decode(batch)

    return StubModule(name, {"spec_prepare_for_decode": spec_prepare_for_decode})


def accept(rng: random.Random, config: SpecConfig) -> int:
    """Tokens one verify step commits: the bonus token plus 0..num_steps accepted drafts."""
    return 1 + rng.randint(0, config.num_steps)
