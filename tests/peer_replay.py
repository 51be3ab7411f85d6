"""One trace through two prefix caches, request by request: kvwatch's radix
backend and SGLang's RadixCache, each op timed in thread CPU time.

Both sides see the same prompts in the same order and do what a server does
around each op, untimed: compute the prompt's new tokens (pages only, no
model), then release the request. Which calls each side times is listed in
test_bench_peer.py: ``match`` (match + lock), ``insert`` (kvwatch
``commit_chunk``; SGLang ``_insert_cache``, its insert and duplicate free),
``evict`` (everything, once every request has been released).
"""

from __future__ import annotations

import gc
import math
import time
from array import array
from types import SimpleNamespace
from typing import NamedTuple

import torch
from cachesim import cache_config
from peer_sglang import PagedAllocator, RowPool, Sglang

from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.pool import PageLayout
from kvwatch.engine.cache.protocol import Capture
from kvwatch.engine.config import FULL_KV, GROUP_NAMES

PAGE = 16
INTERVAL = 256
OPS = ("match", "insert", "evict")


def _clock(fn, *args, **kw):
    start = time.thread_time()
    out = fn(*args, **kw)
    return out, time.thread_time() - start


class KvwatchSide:
    """kvwatch's radix backend, built the way the engine builds it, through its protocol."""

    def __init__(self, prompts: list[tuple[int, ...]], profile=None) -> None:
        tokens = sum(len(p) for p in prompts)
        snapshots = sum(len(p) // INTERVAL + 3 for p in prompts)
        config = cache_config(
            window=32,
            interval=INTERVAL,
            page=PAGE,
            full=tokens // PAGE + 4096,
            swa=8192,
            snapshots=snapshots,
        )
        self.cache = build_cache(config, {g: PageLayout((), torch.float16) for g in GROUP_NAMES})
        self.spent = dict.fromkeys(OPS, 0.0)
        self.profile = profile  # a cProfile.Profile to run inside the timed ops only
        self.hits = 0
        self.state = torch.zeros((), dtype=torch.float16)

    def _clock(self, fn, *args):
        if self.profile is None:
            return _clock(fn, *args)
        return _clock(self.profile.runcall, fn, *args)

    def request(self, prompt: list[int]) -> None:
        cache = self.cache
        h = cache.open(prompt)
        m, dt = self._clock(cache.match, h)
        self.spent["match"] += dt
        self.hits += m.hit_len
        start, end = h.computed_len, len(prompt)
        cache.allocate(h, end - start)
        points = cache.capture_points(h, start, end)
        cache.advance(h, end, [Capture(b, kind, self.state) for b, kind in points])
        _, dt = self._clock(cache.commit_chunk, h, True)
        self.spent["insert"] += dt
        cache.release(h, commit=True)

    def finish(self) -> None:
        assert audit(self.cache).clean
        _, self.spent["evict"] = self._clock(self.cache.flush)
        assert self.cache.pools[FULL_KV].used_count == 0, "flush left pages in the tree"
        assert audit(self.cache).clean


class SglangSide:
    """SGLang's RadixCache with a host-side paged allocator and request table."""

    def __init__(self, sg: Sglang, prompts: list[tuple[int, ...]]) -> None:
        self.sg = sg
        self.pages = sum(len(p) for p in prompts) // PAGE + 4096
        self.allocator = PagedAllocator(self.pages, PAGE)
        self.rows = RowPool(1, max(len(p) for p in prompts) + PAGE)
        params = sg.params.CacheInitParams(
            disable=False,
            req_to_token_pool=self.rows,
            token_to_kv_pool_allocator=self.allocator,
            page_size=PAGE,
        )
        self.cache = sg.radix.RadixCache(params)
        self.spent = dict.fromkeys(OPS, 0.0)
        self.hits = 0

    def _match(self, ids: array):
        key = self.sg.radix.RadixKey(ids, None, limit=len(ids) - 1)
        found = self.cache.match_prefix(self.sg.base.MatchPrefixParams(key=key))
        node = found.last_device_node
        return found.device_prefix_len, self.cache.lock(node), self.cache.path_device_indices(node)

    def request(self, ids: array) -> None:
        (hit, lock, prefix), dt = _clock(self._match, ids)
        self.spent["match"] += dt
        self.hits += hit
        row = self.rows.req_to_token[0]
        own = self.allocator.alloc(math.ceil(len(ids) / PAGE) * PAGE - hit)
        row[:hit] = prefix
        row[hit : hit + len(own)] = own
        kv = SimpleNamespace(req_pool_idx=0, cache_protected_len=hit, cache_inserted_len=0)
        req = SimpleNamespace(kv=kv, extra_key=None, cache_salt=None, priority=None)
        _, dt = _clock(self.cache._insert_cache, req, ids)
        self.spent["insert"] += dt
        kept = len(ids) // PAGE * PAGE  # the tree has [0, kept); the partial page is ours
        self.allocator.free_segment(row[kept : hit + len(own)].to(torch.int64), start_pos=kept)
        self.cache.unlock(lock)

    def finish(self) -> None:
        everything = self.sg.base.EvictParams(num_tokens=self.pages * PAGE)
        _, self.spent["evict"] = _clock(self.cache.evict, everything)
        assert self.cache.total_size() == 0, "evict left tokens in the tree"
        free = self.allocator.merged()
        assert free.numel() == self.pages == torch.unique(free).numel(), "pages lost or doubled"


class Totals(NamedTuple):
    kvwatch: dict[str, float]
    sglang: dict[str, float]
    hit_tokens: int  # prompt tokens found in the tree, the same on both sides


def replay(sg: Sglang, prompts: list[tuple[int, ...]], repeats: int, profile=None) -> Totals:
    """``repeats`` replays, each on two fresh caches, interleaved request by request;
    which side goes first alternates every request and every replay. The cyclic
    garbage collector is off inside a replay, so neither side pays for the other's
    garbage."""
    lists, arrays = [list(p) for p in prompts], [array("q", p) for p in prompts]
    totals = Totals(dict.fromkeys(OPS, 0.0), dict.fromkeys(OPS, 0.0), 0)
    hits = 0
    for rep in range(repeats):
        gc.collect()
        gc.disable()
        try:
            kv, sgs = KvwatchSide(prompts, profile), SglangSide(sg, prompts)
            for i in range(len(prompts)):
                pair = [(kv, lists[i]), (sgs, arrays[i])]
                for side, tokens in pair if (i + rep) % 2 else pair[::-1]:
                    side.request(tokens)
            for side in (kv, sgs) if rep % 2 else (sgs, kv):
                side.finish()
        finally:
            gc.enable()
        assert kv.hits == sgs.hits, f"the trees disagree: {kv.hits} hit tokens, SGLang {sgs.hits}"
        hits = kv.hits
        for op in OPS:
            totals.kvwatch[op] += kv.spent[op]
            totals.sglang[op] += sgs.spent[op]
    return totals._replace(hit_tokens=hits)
