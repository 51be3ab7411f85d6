"""kvwatch's plugin for vLLM: bugs planted in vLLM's KV cache manager, on demand.

vLLM calls every ``vllm.general_plugins`` entry point once in each of its
processes, the engine core's included (``EngineCore.__init__``), which is the
process that owns the KV cache manager. kvwatch registers ``register`` there
(``pyproject.toml``); it does nothing unless ``KVWATCH_VLLM_FAULT`` names a
fault, so a vLLM that has kvwatch installed serves as it always does.

With ``KVWATCH_VLLM_PROBE_PORT`` set, the engine core also serves kvwatch's
audit of its KV cache manager on that loopback port (``core_probe.py``).

Faults (``KVWATCH_VLLM_FAULT``):

``free-skipped``
    ``KVCacheManager.free`` returns without freeing on every
    ``KVWATCH_VLLM_EVERY``-th call (default 4): a finished, aborted or preempted
    request keeps its blocks referenced, so they never return to the free
    queue. The real shape of a release skipped on one path.
``evicted-hash-kept``
    ``BlockPool._maybe_evict_cached_block`` resets the hash of every
    ``KVWATCH_VLLM_EVERY``-th cached block it hands out again, but leaves its
    entry in the prefix map: a later request with the old prefix gets a hit on
    a block that now holds another request's KV. Usage is untouched (silent
    corruption, seen only inside the engine); it needs evictions, so a pool
    small enough to reuse cached blocks (``--num-gpu-blocks-override``).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os

FAULT_ENV = "KVWATCH_VLLM_FAULT"
EVERY_ENV = "KVWATCH_VLLM_EVERY"
PROBE_ENV = "KVWATCH_VLLM_PROBE_PORT"

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


def _evicted_hash_kept() -> None:
    from vllm.v1.core.block_pool import BlockPool

    every = int(os.environ.get(EVERY_ENV, "4"))
    original = BlockPool._maybe_evict_cached_block
    calls = itertools.count(1)

    @functools.wraps(original)
    def evict(self, block) -> bool:
        if block.block_hash is not None and next(calls) % every == 0:
            # the block is reused and forgets its hash; the map still points at it
            self.cached_block_hashes_by_block.pop(block.block_id, None)
            block.reset_hash()
            return True
        return original(self, block)

    BlockPool._maybe_evict_cached_block = evict


FAULTS = {"free-skipped": _free_skipped, "evicted-hash-kept": _evicted_hash_kept}


def _in_engine_core() -> bool:
    """True in vLLM's engine core process (``EngineCore`` or ``EngineCore_DPn``,
    as vLLM names the process it starts for it)."""
    import multiprocessing

    return multiprocessing.current_process().name.startswith("EngineCore")


def register() -> None:
    """vLLM's hook, at most once in each process: plant the fault
    ``KVWATCH_VLLM_FAULT`` names, and in the engine core start the probe."""
    if os.environ.get(PROBE_ENV) and _in_engine_core():
        from kvwatch.targets.vllm import core_probe

        core_probe.install(int(os.environ[PROBE_ENV]))
    name = os.environ.get(FAULT_ENV)
    if not name:
        return
    if name not in FAULTS:
        raise ValueError(f"{FAULT_ENV}={name!r}: faults are {', '.join(FAULTS)}")
    FAULTS[name]()
    log.warning("kvwatch: fault %s planted in pid %d", name, os.getpid())
