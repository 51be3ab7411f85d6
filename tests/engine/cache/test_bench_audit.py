"""Benchmark: the full audit, and the probe built on it, as the pool and the tree grow.

`make test` runs a 10k-page smoke (benchmarks disabled: one call each);
`make bench` measures 10k, 100k and 1M pages (KVWATCH_BENCH_PAGES).
The tree is realistic: 16 shared system prompts, each continued by many
conversations (1k tokens by default), 64 of them still running. Shorter
conversations on the same pool make a tree with more nodes.
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from cachesim import cache_config

from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.base import CacheBase
from kvwatch.engine.cache.pool import PageLayout
from kvwatch.engine.cache.protocol import holder_of
from kvwatch.engine.config import (
    FULL_KV,
    GROUP_NAMES,
)
from kvwatch.engine.probe import QueueReport, take_probe

SIZES = [int(n) for n in os.environ.get("KVWATCH_BENCH_PAGES", "10000").split(",")]


IDLE = QueueReport(waiting=0, running=0, retracted=0, paused=0)
TREE_PAGES = int(os.environ.get("KVWATCH_BENCH_TREE_PAGES", "10000"))


def filled_cache(pages: int, suffix: int = 1024) -> CacheBase:
    config = cache_config(window=32, interval=256, page=16, full=pages, swa=4096, snapshots=4096)
    cache = build_cache(config, {g: PageLayout((), torch.float16) for g in GROUP_NAMES})
    rng = random.Random(0)
    systems = [[rng.randrange(1000) for _ in range(512)] for _ in range(16)]
    running = 0
    pool = cache.pools[FULL_KV]
    grown = True
    while pool.free_count > 100 and grown:  # stop once a request only re-adopts cached pages
        before = cache.view.tree.page_count
        holder = cache.open(rng.choice(systems) + [rng.randrange(1000) for _ in range(suffix)])
        cache.match(holder)
        n = min(len(holder_of(holder).tokens) - holder.computed_len, (pool.free_count - 80) * 16)
        cache.allocate(holder, n)
        cache.advance(holder, holder.computed_len + n)
        cache.commit_chunk(holder)
        if running < 64:
            running += 1
        else:
            cache.release(holder, commit=True)
        grown = cache.view.tree.page_count > before
    return cache


@pytest.mark.bench
@pytest.mark.parametrize("pages", SIZES)
def test_audit_cost(benchmark, pages):
    cache = filled_cache(pages)
    benchmark.extra_info.update(
        pages=pages, nodes=cache.view.tree.node_count, holders=len(cache.view.holders)
    )
    report = benchmark.pedantic(audit, args=(cache.view,), rounds=5, iterations=1, warmup_rounds=1)
    assert report.clean and cache.pools[FULL_KV].used_count > 0.98 * pages - 100


@pytest.mark.bench
@pytest.mark.parametrize("pages", SIZES)
def test_probe_cost(benchmark, pages):
    """What ``GET /debug/probe`` costs the engine loop: audit, usage, bounds, tree stats."""
    cache = filled_cache(pages)
    benchmark.extra_info.update(pages=pages, nodes=cache.view.tree.node_count)
    report = benchmark.pedantic(
        take_probe, args=(cache.reads, 0, IDLE), rounds=5, iterations=1, warmup_rounds=1
    )
    assert not report.findings


@pytest.mark.bench
@pytest.mark.parametrize("suffix", [1024, 256, 64])
def test_audit_cost_as_the_tree_grows(benchmark, suffix):
    """The same pool, filled by shorter conversations: more nodes per page."""
    cache = filled_cache(TREE_PAGES, suffix)
    benchmark.extra_info.update(pages=TREE_PAGES, suffix=suffix, nodes=cache.view.tree.node_count)
    report = benchmark.pedantic(audit, args=(cache.view,), rounds=5, iterations=1, warmup_rounds=1)
    assert report.clean
