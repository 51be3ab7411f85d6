"""kvwatch's plugin for vLLM: bugs planted in vLLM's KV cache manager, on demand.

vLLM calls every ``vllm.general_plugins`` entry point once in each of its
processes, the engine core's included (``EngineCore.__init__``), which is the
process that owns the KV cache manager. kvwatch registers ``register`` there
(``pyproject.toml``); it does nothing unless ``KVWATCH_VLLM_FAULT`` names a
fault, so a vLLM that has kvwatch installed serves as it always does.

Faults (``KVWATCH_VLLM_FAULT``):

``free-skipped``
    ``KVCacheManager.free`` returns without freeing on every
    ``KVWATCH_VLLM_EVERY``-th call (default 4): a finished, aborted or preempted
    request keeps its blocks referenced, so they never return to the free
    queue. The real shape of a release skipped on one path.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os

FAULT_ENV = "KVWATCH_VLLM_FAULT"
EVERY_ENV = "KVWATCH_VLLM_EVERY"

log = logging.getLogger("kvwatch.vllm")


def _free_skipped() -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    every = int(os.environ.get(EVERY_ENV, "4"))
    original = KVCacheManager.free
    calls = itertools.count(1)

    @functools.wraps(original)
    def free(self, request) -> None:
        if next(calls) % every == 0:
            return  # the request's blocks keep their ref counts: never freed
        original(self, request)

    KVCacheManager.free = free


FAULTS = {"free-skipped": _free_skipped}


def register() -> None:
    """vLLM's hook: plant the fault ``KVWATCH_VLLM_FAULT`` names, if any (once
    per process: vLLM calls this at most once in each)."""
    name = os.environ.get(FAULT_ENV)
    if not name:
        return
    if name not in FAULTS:
        raise ValueError(f"{FAULT_ENV}={name!r}: faults are {', '.join(FAULTS)}")
    FAULTS[name]()
    log.warning("kvwatch: fault %s planted in pid %d", name, os.getpid())
