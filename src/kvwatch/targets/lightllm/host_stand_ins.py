"""The stand-ins with behaviour that LightLLM's caches and infer loop import.

Each is a whole module, served in place of LightLLM's own (or of a third-party
package) by ``source_hooks.py``:

* ``triton`` / ``triton.language``: ``cdiv`` and ``next_power_of_2`` (the
  pools' sizes are computed with them), ``jit`` a no-op decorator; no kernel
  runs (the kernels that copy KV and linear-attention state are stubs, so
  the pools' contents are not moved: the audit counts slots, not contents);
* ``lightllm.utils.dist_utils``: rank 0 of a world of 1 (no distributed
  setup);
* ``lightllm.utils.shm_utils``: ``create_or_link_shm`` with buffers in this
  process instead of POSIX shared memory, same contract (a second create or
  link of a name gets the same buffer): the router process that would read
  the cache's and the allocator's counters is not there;
* ``lightllm.utils.custom_kernel_utis``: ``custom_cat`` as ``torch.cat``
  (LightLLM's asserts CUDA tensors);
* ``easydict``: ``EasyDict``, a dict whose keys read as attributes, which is
  all ``envs_utils.get_env_start_args`` needs it for (the start args are a
  flat JSON object).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from kvwatch.targets.stand_ins import StubModule

DIST_ZERO = (
    "get_current_rank_in_node",
    "get_current_rank_in_dp",
    "get_current_device_id",
    "get_global_rank",
    "get_global_dp_rank",
    "get_dp_rank_in_node",
    "get_node_rank",
)
DIST_ONE = ("get_node_world_size", "get_dp_world_size", "get_global_world_size", "get_dp_size")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _jit(fn: Any = None, **kwargs: Any) -> Any:
    return fn if fn is not None else (lambda f: f)


def triton_modules() -> dict[str, types.ModuleType]:
    language = StubModule("triton.language", package=True)
    language.constexpr = int
    triton = StubModule("triton", package=True)
    triton.cdiv = _cdiv
    triton.next_power_of_2 = lambda n: 1 << (int(n) - 1).bit_length()
    triton.jit = _jit
    triton.language = language
    return {"triton": triton, "triton.language": language}


def dist_utils() -> types.ModuleType:
    module = StubModule("lightllm.utils.dist_utils")
    for name in DIST_ZERO:
        setattr(module, name, lambda *a, **k: 0)
    for name in DIST_ONE:
        setattr(module, name, lambda *a, **k: 1)
    return module


class InProcessShm:
    """What ``multiprocessing.shared_memory.SharedMemory`` gives LightLLM: ``buf``,
    ``size``, ``name``, ``close``, ``unlink``."""

    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size
        self._bytes = bytearray(size)
        self.buf = memoryview(self._bytes)

    def close(self) -> None:
        pass

    def unlink(self) -> None:
        pass


def shm_utils() -> types.ModuleType:
    module = StubModule("lightllm.utils.shm_utils")
    segments: dict[str, InProcessShm] = {}

    def create_or_link_shm(name, expected_size, force_mode=None, auto_cleanup=False):
        if force_mode == "create" or name not in segments:
            segments[name] = InProcessShm(name, int(expected_size))
        shm = segments[name]
        if expected_size != -1 and shm.size != int(expected_size):
            raise ValueError(f"Shared memory {name} size mismatch")
        return shm

    module.create_or_link_shm = create_or_link_shm
    module.SEGMENTS = segments
    return module


def custom_kernel_utils() -> types.ModuleType:
    module = StubModule("lightllm.utils.custom_kernel_utis")
    module.custom_cat = lambda tensors: torch.cat(list(tensors))
    return module


class EasyDict(dict):
    """A dict whose keys read (and write) as attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


def easydict_module() -> types.ModuleType:
    module = types.ModuleType("easydict")
    module.EasyDict = EasyDict
    return module


def fixed_modules() -> dict[str, types.ModuleType]:
    """Every stand-in with behaviour, by the module name it is served as."""
    out = triton_modules()
    out["lightllm.utils.dist_utils"] = dist_utils()
    out["lightllm.utils.shm_utils"] = shm_utils()
    out["lightllm.utils.custom_kernel_utis"] = custom_kernel_utils()
    out["easydict"] = easydict_module()
    return out
