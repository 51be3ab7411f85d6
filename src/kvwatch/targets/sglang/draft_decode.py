"""Speculative decoding without a draft model: what EAGLE's "spec v2" does to the pools.

SGLang's spec-v2 decode step over-allocates: before each decode step every
request is topped up to ``kv_committed_len + 2 * alloc_len_per_decode``
allocated slots, and the verify step commits ``1 + accepted drafts`` of
them. ``allocated - committed`` is what a finished request has
over-allocated, which ``common.release_kv_cache`` frees except on paths that
skip it (seed 001: a streaming session's next turn writes over it).

Only the checkpoint shim (0.5.22+) decodes with drafts; the own scheduler
has no draft worker. From 0.5.22 ``ScheduleBatch.prepare_for_decode`` calls
``spec_utils.spec_prepare_for_decode``, which for EAGLE runs the release's
own ``eagle_utils.eagle_prepare_for_decode``: that one is imported for real;
only the dispatcher module (it runs ``torch.compile`` at import) is
replaced, by ``spec_utils_module``; ``DraftInput`` is only the batch's
``spec_info`` placeholder.

``accept`` draws how many tokens one verify step commits (the bonus token
and 0..num_steps accepted drafts); ``Algorithm`` stands in for
``SpeculativeAlgorithm`` (EAGLE or none).
"""

from __future__ import annotations

import importlib
import random
from typing import Any

from kvwatch.targets.sglang.shim_parts import SpecConfig
from kvwatch.targets.stand_ins import StubModule


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
    """The batch's ``spec_info``: its place in the batch (the release's own code
    allocates and verifies)."""

    def __init__(self) -> None:
        self.verify_done = None

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
