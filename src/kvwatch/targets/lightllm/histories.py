"""LightLLM's own infer loop as a ``HistoryTarget``: a source checkout, by named setup.

LightLLM is imported from a checkout (``--lightllm-src DIR``, or
``$KVWATCH_LIGHTLLM_SRC``) in a driver process of kvwatch's own Python (the
history tier's ``driver_process`` with this target's factory
``history_loop.make_loop``): importing it changes torch and the import system
for the whole process (``cpu_torch``, ``source_hooks``), which must not reach
the judging one. The process plays every history while ``opened()`` lasts
and sends each back as plain JSON (``histories/played_json.py``)::

    LightllmHistoryTarget.answer(history) --{"setup", "history"}--> driver_process
        history_loop.make_loop: infer_build.build(checkout, sizes) -> HistoryInferLoop
    <--{"played", "unasked"}-- judged by histories.checks as any target's

``SETUPS`` size LightLLM's pools so generated histories run into memory
pressure (LightLLM pauses requests that do not fit, and evicts its tree):

``radix``   ``RadixCache``: 16-token prefill chunks, 64 tokens a step, 320 KV tokens
``linear``  ``LinearAttPagedRadixCache`` of a hybrid linear-attention model: the same,
            state pages every 4 tokens, big pages of 4 of them

LightLLM has no sessions and no priorities on this path, no cache-off engine
here (``equivalence`` is skipped), and names no request in its tree's
references, so ``index`` and ``references`` are skipped; its audit after every
iteration (``InferProbe``) is the ``audit`` check.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvwatch.targets.driver.history_process import HistoryProcess
from kvwatch.targets.driver.history_target import ProcessHistoryTarget, Shape
from kvwatch.targets.lightllm.checkout_check import find_checkout
from kvwatch.targets.lightllm.infer_build import InferSizes
from kvwatch.targets.lightllm.workloads import LINEAR_ARGS

DRIVER = "kvwatch.histories.driver_process"
FACTORY = "kvwatch.targets.lightllm.history_loop:make_loop"
SRC_ENV = "KVWATCH_LIGHTLLM_SRC"
CONTEXT = 256
ARGS = {"chunked_prefill_size": 16, "batch_max_tokens": 64}
SETUPS: dict[str, InferSizes] = {
    "radix": InferSizes(cache="radix", kv_tokens=320, max_reqs=8, max_seq=CONTEXT, args=ARGS),
    "linear": InferSizes(
        cache="linear",
        kv_tokens=320,
        max_reqs=8,
        max_seq=CONTEXT,
        args={**ARGS, **LINEAR_ARGS, "linear_att_cache_size": 12},
    ),
}


class LightllmHistoryTarget(ProcessHistoryTarget):
    engine = "lightllm"

    def __init__(self, src: str | Path | None = None, setup: str = "radix") -> None:
        if setup not in SETUPS:
            raise ValueError(f"no LightLLM setup {setup!r}; setups: {', '.join(SETUPS)}")
        folder = src or os.environ.get(SRC_ENV)
        if not folder:
            raise ValueError(f"--engine lightllm needs --lightllm-src DIR (or ${SRC_ENV})")
        self.checkout = find_checkout(folder, SETUPS[setup].cache)  # ValueError: not one
        self.setup, self.sizes = setup, SETUPS[setup]
        self.shape = Shape(
            engine=self.engine,
            page=LINEAR_ARGS["linear_att_hash_page_size"] if setup == "linear" else 16,
            chunk=ARGS["chunked_prefill_size"],
            context=CONTEXT,
            unit=ARGS["batch_max_tokens"],
            vocab=(32, 1000),
            sessions=False,
        )
        self.driver = HistoryProcess("LightLLM's history driver")

    @contextlib.contextmanager
    def opened(self) -> Iterator[None]:
        command = [sys.executable, "-m", DRIVER, FACTORY, str(self.checkout.path)]
        with self.driver.opened(command, os.environ):
            yield

    def answer(self, history: dict[str, Any]) -> dict[str, Any]:
        return self.driver.answer(asdict(self.sizes), history)

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "setup": self.setup,
            "src": str(self.checkout.path),
            "commit": self.checkout.commit,
        }
