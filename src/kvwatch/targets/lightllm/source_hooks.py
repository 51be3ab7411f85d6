"""LightLLM's caches, pools and infer loop imported from a source checkout, in this process.

``install(checkout)`` puts an import hook first on ``sys.meta_path`` that
serves:

* the ``lightllm`` modules in ``REAL`` from the checkout's own files, as
  they are (nothing of LightLLM is copied into kvwatch);
* the stand-ins of ``host_stand_ins.fixed_modules`` (triton, the rank, the
  shared memory, ``custom_cat``, ``easydict``);
* every other ``lightllm`` module, and the third-party packages in
  ``STUBBED_THIRD_PARTY``, as stub modules (``kvwatch.targets.stand_ins``).

A package whose ``__init__`` is not in ``REAL`` is a stub package with the
checkout's ``__path__``: its real submodules import from source, the names
in ``LAZY`` resolve to their real submodule (``kv_cache_mem_manager``'s
``MemoryManager`` without the ``__init__`` that imports every quantised
manager and its kernels; ``core.objs``' ``FinishStatus``), the rest read as
stubs.

A stand-in never holds data LightLLM's code reads back as data: what the
caches and the loop read (token ids, pool indices, hashes) comes from
LightLLM's own classes or from ``infer_records.py``.

Invariant: one checkout per process. LightLLM keeps module singletons
(``g_infer_context``) and caches its start args once (``get_env_start_args``
is ``lru_cache``d), which is why every gate run drives LightLLM in a process
of its own (``run_driver.py``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

from kvwatch.targets.lightllm.host_stand_ins import fixed_modules
from kvwatch.targets.stand_ins import StubModule

REAL = frozenset(
    {
        "lightllm.server.router.dynamic_prompt.radix_cache",
        "lightllm.server.router.dynamic_prompt.linear_att_radix_cache",
        "lightllm.server.router.dynamic_prompt.shared_arr",
        "lightllm.common.kv_cache_mem_manager.allocator",
        "lightllm.common.kv_cache_mem_manager.mem_manager",
        "lightllm.common.kv_cache_mem_manager.qwen3next_mem_manager",
        "lightllm.common.kv_cache_mem_manager.operator",
        "lightllm.common.kv_cache_mem_manager.operator.base",
        "lightllm.common.kv_cache_mem_manager.operator.normal",
        "lightllm.common.kv_cache_mem_manager.operator.quant",
        "lightllm.common.kv_cache_mem_manager.operator.linear_att",
        "lightllm.common.kv_cache_mem_manager.operator.deepseek",
        "lightllm.common.kv_cache_mem_manager.operator.fp8_quant",
        "lightllm.common.linear_att_cache_manager",
        "lightllm.common.linear_att_cache_manager.config_objs",
        "lightllm.common.linear_att_cache_manager.layer_cache",
        "lightllm.common.linear_att_cache_manager.linear_att_buffer_manager",
        "lightllm.common.req_manager",
        "lightllm.server.router.model_infer.infer_batch",
        "lightllm.server.router.model_infer.pin_mem_manager",
        "lightllm.server.router.model_infer.mode_backend.base_backend",
        "lightllm.server.router.model_infer.mode_backend.chunked_prefill.impl",
        "lightllm.server.router.model_infer.mode_backend.chunked_prefill.control_state",
        "lightllm.server.router.model_infer.mode_backend.pre",
        "lightllm.server.router.model_infer.mode_backend.generic_pre_process",
        "lightllm.common.basemodel.batch_objs",
        "lightllm.server.core.objs.io_objs",
        "lightllm.server.core.objs.io_objs.group_req",
        "lightllm.utils.log_utils",
        "lightllm.utils.envs_utils",
        "lightllm.utils.torch_dtype_utils",
        # FinishStatus, TokenHashList and their module's imports (the shared-memory
        # request record itself is a stand-in: infer_records.ShmReq)
        "lightllm.server.core.objs.req",
        "lightllm.server.core.objs.sampling_params",
        "lightllm.server.core.objs.out_token_circlequeue",
        "lightllm.server.core.objs.shm_array",
        "lightllm.server.core.objs.token_chunck_hash_list",
        "lightllm.server.core.objs.logprob_utils",
        "lightllm.server.core.objs.token_metadata",
        "lightllm.server.core.objs.pd_kv_trans_params",
    }
)

# stub packages whose names resolve to a real submodule (their __init__ is not run)
LAZY = {
    "lightllm.common.kv_cache_mem_manager": {
        "KvCacheAllocator": "allocator",
        "MemoryManager": "mem_manager",
        "ReadOnlyStaticsMemoryManager": "mem_manager",
        "Qwen3NextMemManager": "qwen3next_mem_manager",
    },
    "lightllm.server.core.objs": {"FinishStatus": "req", "SamplingParams": "sampling_params"},
}

# third-party packages LightLLM imports at module level that nothing here runs
STUBBED_THIRD_PARTY = frozenset(
    {
        *("transformers", "xxhash", "rpyc", "zmq", "psutil", "requests", "setproctitle"),
        *("triton_kernels", "flashinfer", "sgl_kernel", "lightllm_kernel", "vllm", "deep_ep"),
        *("deep_gemm", "nixl", "prometheus_client", "uvloop", "fastapi", "torchada"),
        *("safetensors", "accelerate", "pydantic", "librosa", "PIL", "cv2", "msgpack"),
        *("ujson", "orjson", "nvtx", "cupy"),
    }
)


class StubPackage(StubModule):
    """A package whose ``__init__`` is not run: real submodules import from
    ``__path__``, names in ``LAZY`` come from their real submodule, the rest are stubs."""

    def __init__(self, name: str, path: Path) -> None:
        super().__init__(name, package=True)
        self.__path__ = [str(path)]

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        where = LAZY.get(self.__name__, {})
        if attr in where:
            value = getattr(importlib.import_module(f"{self.__name__}.{where[attr]}"), attr)
            setattr(self, attr, value)
            return value
        if f"{self.__name__}.{attr}" in REAL:
            return importlib.import_module(f"{self.__name__}.{attr}")
        return super().__getattr__(attr)


class _Fixed(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType) -> None:
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        pass


def _fixed_spec(name: str, module: types.ModuleType) -> importlib.machinery.ModuleSpec:
    return importlib.machinery.ModuleSpec(name, _Fixed(module), is_package=True)


class CheckoutHook(importlib.abc.MetaPathFinder):
    def __init__(self, checkout: Path) -> None:
        self.checkout = Path(checkout)
        self.fixed = fixed_modules()

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if name in self.fixed:
            return _fixed_spec(name, self.fixed[name])
        if top in STUBBED_THIRD_PARTY or top == "triton":
            return _fixed_spec(name, StubModule(name, package=True))
        if top != "lightllm":
            return None
        return self._lightllm_spec(name)

    def _lightllm_spec(self, name: str) -> importlib.machinery.ModuleSpec:
        where = self.checkout / name.replace(".", "/")
        if (where / "__init__.py").exists():
            if name in REAL:
                return importlib.util.spec_from_file_location(
                    name, where / "__init__.py", submodule_search_locations=[str(where)]
                )
            return _fixed_spec(name, StubPackage(name, where))
        if name in REAL and where.with_suffix(".py").exists():
            return importlib.util.spec_from_file_location(name, where.with_suffix(".py"))
        return importlib.machinery.ModuleSpec(name, _Fixed(StubModule(name)), is_package=False)


def install(checkout: Path) -> CheckoutHook:
    """The hook for ``checkout``, first on ``sys.meta_path`` for the rest of the process."""
    hook = CheckoutHook(checkout)
    sys.meta_path.insert(0, hook)
    return hook
