"""SGLang's RadixCache from its released wheel, loaded in this process for a peer benchmark.

``fetch`` downloads ``sglang==0.5.23`` (``pip download --no-deps``) into a
temporary folder and extracts only the modules the radix cache runs on:
``radix_cache``, ``base_prefix_cache``, ``cache_init_params``, ``evict_policy``,
``events``, ``utils`` and ``unified_cache/component_type``, unchanged. ``load``
imports them under their own names, with stand-ins for the imports that need a
GPU or a server:

* GPU kernels (``sglang.kernels``), the native hash extension, the
  environment registry, metrics, the runtime context, the KV event publisher
  (ZMQ) and the 5k-line server helper module that ``ceil_align`` comes from;
* the token-to-KV allocator and the request-to-token pool, which the caller
  passes in (``PagedAllocator``, ``RowPool``).

Nothing stays in ``sys.modules`` afterwards: the loaded modules are reached
through the returned ``Sglang`` record only.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import torch

VERSION = "0.5.23"
REAL = (
    "radix_cache",
    "base_prefix_cache",
    "cache_init_params",
    "evict_policy",
    "events",
    "utils",
    "unified_cache/component_type",
)
STUBBED = (
    "sglang.kernels.ops.kvcache.mla_buffer",
    "sglang.srt.environ",
    "sglang.srt.mem_cache.cpp_utils.native_hash",
    "sglang.srt.observability.metrics_collector",
    "sglang.srt.runtime_context",
    "sglang.srt.disaggregation.kv_events",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.utils.common",
)


class Unavailable(RuntimeError):
    """The wheel could not be fetched or read (no network, no such release)."""


class Sglang(NamedTuple):
    radix: types.ModuleType  # sglang.srt.mem_cache.radix_cache
    base: types.ModuleType  # sglang.srt.mem_cache.base_prefix_cache
    params: types.ModuleType  # sglang.srt.mem_cache.cache_init_params


def fetch(folder: Path) -> Path:
    """Download the wheel into ``folder`` and extract the real modules; their root."""
    wheels = folder / "wheel"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
    cmd += [f"sglang=={VERSION}", "-d", str(wheels)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    found = sorted(wheels.glob("sglang-*.whl"))
    if done.returncode or not found:
        raise Unavailable(f"pip download sglang=={VERSION} failed: {done.stderr.strip()[-400:]}")
    root = folder / "src"
    with zipfile.ZipFile(found[0]) as wheel:
        for name in REAL:
            wheel.extract(f"sglang/srt/mem_cache/{name}.py", root)
    return root


def _stub(name: str) -> types.ModuleType:
    """A module whose every attribute is an inert placeholder class."""
    module = types.ModuleType(name)
    module.__getattr__ = lambda attr: type(attr, (), {})  # type: ignore[method-assign]
    if name.endswith("utils.common"):
        module.ceil_align = lambda x, a: -(-x // a) * a
    return module


def _package(name: str, path: Path | None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)] if path is not None else []
    return module


def load(root: Path) -> Sglang:
    """Import the extracted modules with the stand-ins above; leave sys.modules as found."""
    mem = root / "sglang" / "srt" / "mem_cache"
    packages = {
        "sglang": None,
        "sglang.kernels": None,
        "sglang.kernels.ops": None,
        "sglang.kernels.ops.kvcache": None,
        "sglang.srt": None,
        "sglang.srt.observability": None,
        "sglang.srt.disaggregation": None,
        "sglang.srt.utils": None,
        "sglang.srt.mem_cache": mem,
        "sglang.srt.mem_cache.cpp_utils": None,
        "sglang.srt.mem_cache.unified_cache": mem / "unified_cache",
    }
    before = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    try:
        sys.modules.update({n: _package(n, p) for n, p in packages.items()})
        sys.modules.update({n: _stub(n) for n in STUBBED})
        get = importlib.import_module
        return Sglang(
            get("sglang.srt.mem_cache.radix_cache"),
            get("sglang.srt.mem_cache.base_prefix_cache"),
            get("sglang.srt.mem_cache.cache_init_params"),
        )
    finally:
        for name in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[name]
        sys.modules.update(before)


class PagedAllocator:
    """What SGLang's paged allocator does on the host, at its cheapest: hand out
    whole pages as token indices; ``free_segment`` takes one index per page,
    divides it down and stages the page ids in a list (as its free groups and
    sorted mode do), merged into the free list only when an alloc runs short.
    No debug checks, as in a production server."""

    def __init__(self, pages: int, page_size: int) -> None:
        self.page_size = page_size
        self.device = "cpu"
        self.free_pages = torch.arange(1, pages + 1, dtype=torch.int64)
        self.staged: list[torch.Tensor] = []

    def merged(self) -> torch.Tensor:
        if self.staged:
            self.free_pages = torch.cat((*self.staged, self.free_pages))
            self.staged = []
        return self.free_pages

    def alloc(self, tokens: int) -> torch.Tensor:
        n = tokens // self.page_size
        if n > self.free_pages.numel():
            self.merged()
        out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return (out[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)

    def free_segment(self, index: torch.Tensor, *, start_pos: int) -> None:
        if index.numel():
            self.staged.append(index[:: self.page_size] // self.page_size)


class RowPool:
    """The request-to-token table: one row of KV indices per running request."""

    def __init__(self, rows: int, width: int) -> None:
        self.req_to_token = torch.zeros((rows, width), dtype=torch.int32)

    def write(self, index: Any, values: torch.Tensor) -> None:
        self.req_to_token[index] = values
