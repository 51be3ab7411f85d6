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
import math
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch
from peer_timing import Clock

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


class RadixSide:
    """SGLang's ``RadixCache`` with ``PagedAllocator`` and a one-row ``RowPool``.

    match: ``match_prefix`` on the prompt minus its last token (as its
    scheduler limits it) + ``lock(last_node)`` + ``path_device_indices``.
    insert: ``_insert_cache`` (read the request's row, insert, free the
    duplicate pages through ``free_segment``), then free the unaligned last
    page and ``unlock``: what finishing a request costs, without the re-match,
    row rewrite and lock move ``checkpoint`` adds for a request that goes on.
    """

    name = "SGLang"

    def __init__(self, sg: Sglang, prompts: list[tuple[int, ...]], page: int, pages: int) -> None:
        self.sg, self.page, self.pages = sg, page, pages
        self.allocator = PagedAllocator(self.pages, page)
        self.rows = RowPool(1, max(len(p) for p in prompts) + page)
        params = sg.params.CacheInitParams(
            disable=False,
            req_to_token_pool=self.rows,
            token_to_kv_pool_allocator=self.allocator,
            page_size=page,
        )
        self.cache = sg.radix.RadixCache(params)
        self.clock = Clock()
        self.hits = self.resumed = 0

    def _match(self, ids: list[int]):
        key = self.sg.radix.RadixKey(ids, None, limit=len(ids) - 1)
        found = self.cache.match_prefix(self.sg.base.MatchPrefixParams(key=key))
        node = found.last_device_node
        return found.device_prefix_len, self.cache.lock(node), self.cache.path_device_indices(node)

    def _finish(self, req: SimpleNamespace, ids: list[int], lock: Any, end: int) -> None:
        self.cache._insert_cache(req, ids)
        kept = len(ids) // self.page * self.page  # the tree has [0, kept)
        row = self.rows.req_to_token[0]
        self.allocator.free_segment(row[kept:end].to(torch.int64), start_pos=kept)
        self.cache.unlock(lock)

    def request(self, ids: list[int]) -> None:
        hit, lock, prefix = self.clock.time("match", self._match, ids)
        self.hits += hit
        self.resumed += hit
        row = self.rows.req_to_token[0]
        own = self.allocator.alloc(math.ceil(len(ids) / self.page) * self.page - hit)
        row[:hit] = prefix
        row[hit : hit + len(own)] = own
        kv = SimpleNamespace(req_pool_idx=0, cache_protected_len=hit, cache_inserted_len=0)
        req = SimpleNamespace(kv=kv, extra_key=None, cache_salt=None, priority=None)
        self.clock.time("insert", self._finish, req, ids, lock, hit + len(own))

    def finish(self) -> None:
        everything = self.sg.base.EvictParams(num_tokens=self.pages * self.page)
        self.clock.time("evict", self.cache.evict, everything)
        assert self.cache.total_size() == 0, "evict left tokens in the tree"
        free = self.allocator.merged()
        assert free.numel() == self.pages == torch.unique(free).numel(), "pages lost or doubled"

    @property
    def spent(self) -> dict[str, float]:
        return self.clock.spent
