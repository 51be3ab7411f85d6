"""SGLang's hybrid prefix caches for the peer benchmark: ``MambaRadixCache`` and ``SWARadixCache``.

Both come from SGLang 0.5.11 (``HYBRID_VERSION``), the last release this
project loads that ships them as classes of their own (0.5.22 and later
build every model's cache as ``UnifiedRadixCache`` with FULL / MAMBA / SWA
components). The release is loaded unmodified from its wheel with the
project's stand-ins for GPU and server modules (``kvwatch.targets.sglang``);
its own pools and allocators are used, on CPU:

mamba
    ``MambaRadixCache`` over ``HybridReqToTokenPool`` (one ``MambaPool``
    state slot per request and per cached state) and
    ``TokenToKVPoolAllocator``. Page size 1: without its extra buffer (the
    chunk-aligned state tracking of a server started with it) the release
    refuses any other. A cached state sits where a request ended, and a match
    resumes at the deepest node that has one.
swa
    ``SWARadixCache`` over ``SWATokenToKVPoolAllocator`` (a full and a
    window sub-allocator), window 32, 16-token pages. A match resumes wherever
    the last window of the prefix is still cached: with nothing evicted,
    everywhere the history matches.

A request is what the scheduler does for a prompt computed in one chunk::

    match_prefix(prompt[:-1], cow_mamba) + inc_lock_ref(last node)   timed: match
    row and mamba slot (req_to_token_pool.alloc), pages for the rest (allocator)
    cache_finished_req(req)                                          timed: insert
    the row freed

``cache_finished_req`` inserts the prompt's page-aligned tokens, frees the
duplicate and unaligned pages, hands the request's state to the tree or frees
it (mamba), and unlocks. ``finish`` times ``evict`` of everything inside one of
the allocator's free groups (``free_group_begin`` / ``end``: the pages come
back in one concatenation, as kvwatch frees an eviction's pages in one call
per group; one at a time, each free would copy the whole free list) and
checks that the tree and the allocator are back to empty. Both sides' pools
have the same number of pages: what the trace's tree holds, plus slack.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import torch
from peer_timing import Clock

from kvwatch.targets.sglang import kv_pools
from kvwatch.targets.sglang.loop_parts import PoolConfig
from kvwatch.targets.sglang.release_import import Release

HYBRID_VERSION = "0.5.11"
MAMBA_PAGE = 1
SWA_PAGE = 16
WINDOW = 32


def _swa_allocator(release: Release, tokens: int) -> Any:
    """The release's ``SWATokenToKVPoolAllocator`` over a KV pool that stores nothing."""
    allocator = release.cls("swa_allocator")
    kvcache = kv_pools.host_swa_pool(sys.modules[allocator.__module__].SWAKVPool)
    return allocator(
        size=tokens,
        size_swa=tokens,
        page_size=SWA_PAGE,
        dtype=torch.float32,
        device="cpu",
        kvcache=kvcache,
        need_sort=False,
    )


class HybridSide:
    """One of SGLang's hybrid caches, ``kind`` "mamba" or "swa"; call inside ``release.active()``."""

    name = "SGLang"

    def __init__(self, release: Release, prompts: list[tuple[int, ...]], kind: str, pages: int):
        self.release, self.kind = release, kind
        self.page = MAMBA_PAGE if kind == "mamba" else SWA_PAGE
        longest = max(len(p) for p in prompts)
        self.tokens = pages * self.page
        config = PoolConfig(
            kv_tokens=self.tokens,
            page_size=self.page,
            req_slots=1,
            max_context_len=longest + self.page,
            mamba_slots=len(prompts) + 8 if kind == "mamba" else None,
        )
        kv_pools.register_kernels()
        self.rows = kv_pools._req_pool(release, config)
        if kind == "mamba":
            self.allocator = kv_pools._allocator(release, config, self.rows)
        else:
            self.allocator = _swa_allocator(release, self.tokens)
        params = release.cls("cache_init_params")(
            disable=False,
            req_to_token_pool=self.rows,
            token_to_kv_pool_allocator=self.allocator,
            page_size=self.page,
            sliding_window_size=WINDOW if kind == "swa" else None,
        )
        self.cache = release.cls("mamba_radix" if kind == "mamba" else "swa_radix")(params)
        self.base = release.module("base")
        self.key = release.module("radix").RadixKey
        self.clock = Clock()
        self.hits = self.resumed = 0

    def _match(self, ids: list[int], req: SimpleNamespace) -> int:
        params = self.base.MatchPrefixParams(
            key=self.key(ids[:-1], None), cow_mamba=self.kind == "mamba", req=req
        )
        found = self.cache.match_prefix(params)
        req.last_node = found.last_device_node
        req.swa_uuid_for_lock = self.cache.inc_lock_ref(req.last_node).swa_uuid_for_lock
        req.prefix_indices = found.device_indices
        return len(found.device_indices)

    def _pages(self, row: torch.Tensor, hit: int, end: int) -> torch.Tensor:
        """KV slots for tokens [hit, end): whole pages from the allocator, as the
        scheduler's ``alloc_extend`` hands them out (``alloc`` at page size 1)."""
        if self.page == 1:
            return self.allocator.alloc(end - hit)
        last = row[hit - 1 : hit].to(torch.int64) if hit else torch.tensor([-1])
        pre, seq = torch.tensor([hit]), torch.tensor([end])
        return self.allocator.alloc_extend(pre, pre, seq, seq, last, end - hit)

    def request(self, ids: list[int]) -> None:
        req = SimpleNamespace(
            req_pool_idx=None, mamba_pool_idx=None, is_chunked=0, kv_committed_len=0
        )
        hit = self.clock.time("match", self._match, ids, req)
        self.hits += hit
        self.resumed += hit
        self.rows.alloc([req])
        row = self.rows.req_to_token[req.req_pool_idx]
        row[:hit] = req.prefix_indices
        row[hit : len(ids)] = self._pages(row, hit, len(ids))
        req.__dict__.update(
            origin_input_ids=ids,
            output_ids=[],
            extra_key=None,
            cache_protected_len=hit,
            swa_evicted_seqlen=0,
            mamba_last_track_seqlen=None,
            pop_committed_kv_cache=lambda: len(ids),
        )
        self.clock.time("insert", self.cache.cache_finished_req, req)
        self.rows.free(req)

    def _evict_all(self) -> None:
        every = self.tokens
        params = self.base.EvictParams(num_tokens=every, swa_num_tokens=every, mamba_num=every)
        self.allocator.free_group_begin()
        self.cache.evict(params)
        self.allocator.free_group_end()

    def finish(self) -> None:
        self.clock.time("evict", self._evict_all)
        sizes = self.cache.total_size()
        assert all(s == 0 for s in (sizes if isinstance(sizes, tuple) else (sizes,))), sizes
        assert self.allocator.available_size() == self.tokens, "pages lost"

    @property
    def spent(self) -> dict[str, float]:
        return self.clock.spent
