"""SGLang's own pools and allocators, built on CPU for one run.

Everything here is the release's class, constructed with CPU arguments
(only the ones its signature takes: they changed between releases):

* ``ReqToTokenPool`` (the request-to-token table, a free list of rows), or
  ``HybridReqToTokenPool`` with its ``MambaPool`` (one state slot per request
  or tree snapshot) for a hybrid SSM model;
* ``TokenToKVPoolAllocator`` (page size 1) or ``PagedTokenToKVPoolAllocator``
  (page size > 1): free lists of token slots or pages with no KV tensors
  behind them (``kvcache=None``: nothing copies KV on the host);
* for a hybrid sliding-window model, ``SWATokenToKVPoolAllocator`` (a full
  and an SWA sub-allocator and the full -> SWA index map) over
  ``host_swa_pool``, a subclass of the release's ``BaseSWAKVPool`` that holds
  no KV (ours: it only keeps the index map the allocator registers).

The paged allocator launches two triton kernels; ``register_kernels``
installs torch stand-ins for them (ours, from what the kernels compute: the
slots of each request's new tokens, continuing its last page, then fresh
pages from the free list in batch order). Mamba state tensors are one layer
of a few floats: only their slot bookkeeping matters here.

Invariant: every pool and allocator object is the release's own class (the
SWA KV pool aside, which stores nothing the audit reads).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch

from kvwatch.targets.sglang.host_modules import register_kernel
from kvwatch.targets.sglang.loop_parts import PoolConfig
from kvwatch.targets.sglang.release_import import Release


class Pools(NamedTuple):
    req_to_token_pool: Any  # ReqToTokenPool or HybridReqToTokenPool
    allocator: Any  # (Paged)TokenToKVPoolAllocator or SWATokenToKVPoolAllocator
    config: PoolConfig

    @property
    def mamba_pool(self) -> Any | None:
        return getattr(self.req_to_token_pool, "mamba_pool", None)

    @property
    def mamba_slots(self) -> Any | None:
        """Who keeps the free mamba slots: the ``MambaSlotAllocator`` (0.5.22+) or
        the ``MambaPool`` itself (before)."""
        return getattr(self.req_to_token_pool, "mamba_allocator", None) or self.mamba_pool

    @property
    def swa(self) -> bool:
        return getattr(self.allocator, "swa_attn_allocator", None) is not None


def _alloc_extend(pre_lens, seq_lens, last_loc, free_pages, out, bs_upper, page_size, *_):
    """Slots for tokens [prefix, seq) of each request: the rest of its last page
    (after ``last_loc``), then new pages from ``free_pages`` in batch order."""
    pos, taken = 0, 0
    for pre, seq, last in zip(pre_lens.tolist(), seq_lens.tolist(), last_loc.tolist(), strict=True):
        boundary = min(seq, -(-pre // page_size) * page_size)
        n_tail = boundary - pre
        out[pos : pos + n_tail] = last + 1 + torch.arange(n_tail)
        pos += n_tail
        n_new = -(-seq // page_size) - -(-pre // page_size)
        if seq > boundary:
            pages = free_pages[taken : taken + n_new]
            slots = (pages[:, None] * page_size + torch.arange(page_size)).reshape(-1)
            out[pos : pos + seq - boundary] = slots[: seq - boundary]
            pos += seq - boundary
        taken += n_new


def _alloc_decode(seq_lens, last_loc, free_pages, out, bs_upper, page_size, *_):
    """One slot per request for token ``seq_len - 1``: a new page when it starts one."""
    taken = 0
    for i, (seq, last) in enumerate(zip(seq_lens.tolist(), last_loc.tolist(), strict=True)):
        if (seq - 1) % page_size == 0:
            out[i] = free_pages[taken] * page_size
            taken += 1
        else:
            out[i] = last + 1


def register_kernels() -> None:
    register_kernel("alloc_extend_kernel", _alloc_extend)
    register_kernel("alloc_decode_kernel", _alloc_decode)


def construct(cls: type, **offered: Any) -> Any:
    """``cls(**offered)``, restricted to the arguments its ``__init__`` takes."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return cls(**offered)
    return cls(**{k: v for k, v in offered.items() if k in params})


def _mamba_params(pool_cls: type) -> SimpleNamespace:
    """A one-layer linear-attention state layout; releases before 0.5.10 take one
    conv shape, later ones a list of them."""
    single = "assert conv_state_shape[0] > conv_state_shape[1]" in inspect.getsource(
        pool_cls.__init__
    )
    return SimpleNamespace(
        shape=SimpleNamespace(conv=(4, 2) if single else [(4, 2)], temporal=(1, 2, 2)),
        dtype=SimpleNamespace(conv=torch.float32, temporal=torch.float32),
        layers=[0],
    )


def host_swa_pool(base: type) -> Any:
    """An instance of a subclass of the release's ``BaseSWAKVPool`` with no KV:
    every abstract method is a no-op; the full -> SWA map is kept."""

    def register_mapping(self, mapping):
        self.full_to_swa_index_mapping = mapping

    def translate(self, kv_indices):
        return self.full_to_swa_index_mapping[kv_indices]

    abstract = getattr(base, "__abstractmethods__", ())
    body: dict[str, Any] = {name: (lambda self, *a, **k: None) for name in abstract}
    body.update(
        __init__=lambda self, *a, **k: None,
        register_mapping=register_mapping,
        translate_loc_from_full_to_swa=translate,
        full_kv_pool=None,
        swa_kv_pool=None,
        swa_req_ring_size=None,
    )
    return type("HostSWAKVPool", (base,), body)()


def _req_pool(release: Release, config: PoolConfig) -> Any:
    memory_pool = release.module("memory_pool")
    common = dict(
        size=config.req_slots,
        max_context_len=config.max_context_len,
        device="cpu",
        enable_memory_saver=False,
    )
    if config.mamba_slots is None:
        return construct(memory_pool.ReqToTokenPool, **common)
    return construct(
        memory_pool.HybridReqToTokenPool,
        **common,
        mamba_size=config.mamba_slots,
        mamba_spec_state_size=config.mamba_slots,
        cache_params=_mamba_params(memory_pool.MambaPool),
        mamba_layer_ids=[0],
        enable_mamba_extra_buffer=False,
        speculative_num_draft_tokens=None,
        enable_overlap_schedule=False,
        start_layer=0,
    )


def _allocator(release: Release, config: PoolConfig, req_pool: Any) -> Any:
    kv = dict(size=config.kv_tokens, dtype=torch.float32, device="cpu", kvcache=None)
    kv["need_sort"] = False
    if config.swa_tokens is not None:
        if not (release.has("swa_allocator") and release.has("swa_kv_pool")):
            raise LookupError(f"sglang {release.version} has no SWA allocator over a BaseSWAKVPool")
        kv.update(
            kvcache=host_swa_pool(release.cls("swa_kv_pool")),
            size_swa=config.swa_tokens,
            page_size=config.page_size,
            req_to_token_pool=req_pool,
        )
        return construct(release.cls("swa_allocator"), **kv)
    allocator = release.module("allocator")
    if config.page_size == 1:
        return construct(allocator.TokenToKVPoolAllocator, **kv)
    return construct(allocator.PagedTokenToKVPoolAllocator, page_size=config.page_size, **kv)


def build(release: Release, config: PoolConfig) -> Pools:
    """The release's pools for ``config`` (call while the release is active)."""
    register_kernels()
    req_pool = _req_pool(release, config)
    return Pools(req_pool, _allocator(release, config, req_pool), config)
