"""The stand-in modules that need real behaviour on a CPU host (ours, small).

``release_import.py`` serves these in place of the release's own modules:

* ``triton`` / ``triton.language``: ``@triton.jit`` makes a ``Kernel`` whose
  launch (``kernel[grid](...)``) runs the torch function registered for that
  kernel's name (``register_kernel``; ``kv_pools.py`` registers the paged
  allocator's two), and raises for any other kernel; ``triton.language.core``
  has triton's tensor size limit, which 0.5.9's paged allocator reads;
* ``sgl_kernel``: the one host op SGLang's allocation path calls on a CPU,
  ``assign_req_to_token_pool_cpu``;
* ``sglang.srt.platforms`` (0.5.2x): ``current_platform`` is a CPU host with
  no triton and no platform-specific allocator or KV pool classes;
* ``sglang.srt.utils`` / ``sglang.srt.utils.common``: the helpers the cache
  code calls (``ceil_align``, ``get_num_new_pages``, the env-var readers,
  the platform probes answering "CPU", the host-to-device copies as plain
  tensors); everything else there is a stub;
* ``sglang.srt.server_args``: ``ServerArgs``, the global server arguments
  caches and scheduler read before 0.5.16 (``get_global_server_args``);
  ``set_global_server_args_for_scheduler`` sets ``ServerArgsHolder.current``.

Invariant: each helper computes what the release's own helper computes for
the arguments a CPU run passes; nothing here decides a cache operation.
"""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Callable
from typing import Any

from kvwatch.targets.stand_ins import TOUCHED, Stub, StubModule

KERNELS: dict[str, Callable[..., None]] = {}  # triton kernel name -> torch stand-in


def register_kernel(name: str, fn: Callable[..., None]) -> None:
    """Run ``fn(*args, **kwargs)`` wherever SGLang launches the triton kernel ``name``."""
    KERNELS[name] = fn


class Kernel:
    """What ``@triton.jit`` returns: a launch runs the registered torch stand-in."""

    def __init__(self, fn: Callable) -> None:
        self.fn, self.__name__ = fn, fn.__name__

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            impl = KERNELS.get(self.__name__)
            if impl is None:
                raise NotImplementedError(f"triton kernel {self.__name__} has no torch stand-in")
            impl(*args, **kwargs)

        return launch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"triton device function {self.__name__} called on the host")


def _jit(fn: Callable | None = None, **_: Any) -> Any:
    return Kernel(fn) if fn is not None else Kernel


def _kernel_decorator(*_: Any, **__: Any) -> Callable:
    return lambda f: f if isinstance(f, Kernel) else Kernel(f)


def triton_modules() -> dict[str, types.ModuleType]:
    # 0.5.9's paged allocator bounds its extend kernel by triton's tensor size limit
    core = types.SimpleNamespace(TRITON_MAX_TENSOR_NUMEL=1048576)
    language = StubModule("triton.language", {"core": core})
    triton = StubModule(
        "triton",
        {
            "jit": _jit,
            "autotune": _kernel_decorator,
            "heuristics": _kernel_decorator,
            "cdiv": lambda a, b: -(-a // b),
            "next_power_of_2": next_power_of_2,
            "language": language,
            "__version__": "0.0",
        },
        package=True,
    )
    return {"triton": triton, "triton.language": language}


def _assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start, end, out_cache_loc, *_):
    """Row ``req_pool_indices[i]``, columns ``[start[i], end[i])`` get the next
    ``end[i] - start[i]`` entries of ``out_cache_loc``."""
    at = 0
    rows = zip(req_pool_indices.tolist(), start.tolist(), end.tolist(), strict=True)
    for row, lo, hi in rows:
        req_to_token[row, lo:hi] = out_cache_loc[at : at + hi - lo].to(req_to_token.dtype)
        at += hi - lo


def sgl_kernel_module() -> StubModule:
    ops = {"assign_req_to_token_pool_cpu": _assign_req_to_token_pool_cpu}
    return StubModule("sgl_kernel", ops, package=True)


class HostPlatform:
    """``sglang.srt.platforms.current_platform`` on a CPU host."""

    class capabilities:
        supports_triton = False
        hicache_device_kernels = False

    def get_paged_allocator_cls(self, *_: Any, **__: Any) -> None:
        return None

    def get_kv_pool_cls(self, *_: Any, **__: Any) -> None:
        return None

    def is_cpu(self) -> bool:
        return True

    def is_cuda(self) -> bool:
        return False

    def is_cuda_alike(self) -> bool:
        return False

    def is_out_of_tree(self) -> bool:
        return False

    def synchronize(self, *_: Any, **__: Any) -> None:
        pass

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        TOUCHED.add(f"current_platform.{attr}")
        return Stub(f"current_platform.{attr}")


def platforms_module(name: str) -> StubModule:
    return StubModule(name, {"current_platform": HostPlatform()}, package=True)


def ceil_div(x: int, y: int) -> int:
    return -(-x // y)


def ceil_align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 0 else 1


def get_num_new_pages(seq_lens, page_size, prefix_lens=None, decode=False) -> int:
    """Pages a batch needs beyond what its prefixes hold (decode: one token each)."""
    if prefix_lens is None or decode:
        return int((seq_lens % page_size == 1).sum().item()) if page_size > 1 else len(seq_lens)
    after = (seq_lens + page_size - 1) // page_size
    before = (prefix_lens + page_size - 1) // page_size
    return int((after - before).sum().item())


def get_bool_env_var(name: str, default: str = "false") -> bool:
    return os.getenv(name, default).lower() in ("true", "1")


def get_int_env_var(name: str, default: int = 0) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def flatten_nested_list(nested: Any) -> list:
    if isinstance(nested, list):
        return [x for sub in nested for x in flatten_nested_list(sub)]
    return [nested]


def _false(*_: Any, **__: Any) -> bool:
    return False


def async_h2d(args: list, *, dtype: Any, device: Any) -> Any:
    import torch

    return torch.tensor(args, dtype=dtype).to(device)


def async_h2d_stack(tensors: list, *, device: Any) -> Any:
    import torch

    return torch.stack(tensors).to(device)


def flatten_arrays_to_pinned_cpu(parts: list, pin: bool = False) -> Any:
    """``array('q')`` buffers as one int64 tensor (never pinned: no accelerator)."""
    import torch

    return torch.tensor([int(x) for p in parts for x in p], dtype=torch.int64)


UTILS: dict[str, Any] = {
    "ceil_div": ceil_div,
    "ceil_align": ceil_align,
    "next_power_of_2": next_power_of_2,
    "get_num_new_pages": get_num_new_pages,
    "get_bool_env_var": get_bool_env_var,
    "get_int_env_var": get_int_env_var,
    "flatten_nested_list": flatten_nested_list,
    "log_info_on_rank0": lambda logger, msg: logger.info(msg),
    "get_device": lambda *a, **k: "cpu",
    "is_cpu": lambda: True,
    "async_h2d": async_h2d,
    "async_h2d_stack": async_h2d_stack,
    "async_d2h": lambda tensor: tensor,
    "flatten_arrays_to_pinned_cpu": flatten_arrays_to_pinned_cpu,
    **dict.fromkeys(
        (
            "support_triton",
            "is_pin_memory_available",
            "is_cuda",
            "is_hip",
            "is_npu",
            "is_xpu",
            "is_cuda_alike",
            "cpu_has_amx_support",
            "is_gfx95_supported",
            "is_musa",
            "is_mps",
            "require_mlp_tp_gather",
        ),
        _false,
    ),
}


def utils_module(name: str, extra: dict | None = None) -> StubModule:
    return StubModule(name, {**UTILS, **(extra or {})}, package=name.endswith("utils"))


@dataclasses.dataclass
class ServerArgs:
    """The server arguments SGLang's caches and scheduler read, for a CPU run;
    a field not listed reads as None."""

    page_size: int = 1
    attention_backend: str = "torch_native"  # no triton dispatch in common.py
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    max_speculative_num_draft_tokens: int | None = None  # 0.5.13: read by the spec reserve
    disaggregation_mode: str = "null"
    disable_radix_cache: bool = False
    enable_hierarchical_cache: bool = False
    strip_thinking_cache: bool = False
    mamba_cache_chunk_size: int = 64
    mamba_track_interval: int = 256
    mamba_scheduler_strategy: str = "no_buffer"
    enable_mamba_extra_buffer_flag: bool = False
    chunked_prefill_size: int = -1
    max_prefill_tokens: int = 16384
    schedule_conservativeness: float = 1.0
    enable_dp_attention: bool = False
    pp_max_micro_batch_size: int = 1 << 30
    prefill_max_requests: int | None = None
    enable_streaming_session: bool = True
    enable_deterministic_inference: bool = False
    model_path: str = "stand-in"
    tokenizer_path: str = "stand-in"
    device: str = "cpu"

    def enable_mamba_extra_buffer(self) -> bool:
        return self.enable_mamba_extra_buffer_flag

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        TOUCHED.add(f"server_args.{attr}")
        return None


class ServerArgsHolder:
    """The process-wide server arguments a loaded release reads."""

    current = ServerArgs()


def server_args_module(name: str) -> StubModule:
    def publish(args: ServerArgs) -> None:
        ServerArgsHolder.current = args

    values = {
        "ServerArgs": ServerArgs,
        "get_global_server_args": lambda: ServerArgsHolder.current,
        "set_global_server_args_for_scheduler": publish,
    }
    return StubModule(name, values)
