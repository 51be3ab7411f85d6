"""Benchmark: prefix-cache match and insert operations per second on an agentic-trie trace.

Each prompt of the trace is one request through the hybrid cache: ``match``
(walk the radix tree, lock the path, recover state) then, once its new
tokens are computed (a stand-in runner: no model), ``commit_chunk`` (insert
them into the tree). Ops/s of each are timed apart and kept in extra_info.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from benchtrace import agentic_trace
from cachesim import cache_config

from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.pool import PageLayout
from kvwatch.engine.cache.protocol import holder_of
from kvwatch.engine.config import GROUP_NAMES

AGENTS = int(os.environ.get("KVWATCH_BENCH_AGENTS", "3"))
ROUNDS = int(os.environ.get("KVWATCH_BENCH_ROUNDS", "3"))


def replay(trace) -> dict[str, float]:
    config = cache_config(window=32, interval=256, page=16, full=65536, swa=8192, snapshots=2048)
    cache = build_cache(config, {g: PageLayout((), torch.float16) for g in GROUP_NAMES})
    spent = {"match": 0.0, "insert": 0.0}
    for prompt in trace.prompts:
        holder = cache.open(list(prompt))
        t0 = time.perf_counter()
        cache.match(holder)
        t1 = time.perf_counter()
        n = len(holder_of(holder).tokens) - holder.computed_len
        cache.allocate(holder, n)
        cache.advance(holder, holder.computed_len + n)
        t2 = time.perf_counter()
        cache.commit_chunk(holder)
        t3 = time.perf_counter()
        cache.release(holder, commit=True)
        spent["match"] += t1 - t0
        spent["insert"] += t3 - t2
    assert audit(cache.view).clean
    return spent


@pytest.mark.bench
def test_radix_match_and_insert(benchmark):
    trace = agentic_trace(AGENTS, ROUNDS)
    runs = []
    benchmark.pedantic(lambda: runs.append(replay(trace)), rounds=5, warmup_rounds=1)
    best = {k: min(r[k] for r in runs) for k in ("match", "insert")}
    ops = len(trace.prompts)
    benchmark.extra_info.update(
        requests=ops,
        prompt_tokens=trace.total_tokens(),
        match_ops_per_s=round(ops / best["match"]),
        insert_ops_per_s=round(ops / best["insert"]),
    )
