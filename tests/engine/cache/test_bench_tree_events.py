"""Benchmark: what the radix tree's index and ref events cost, in one run.

The same agentic-trie trace through the hybrid cache three ways, interleaved
round by round: the tree with no publisher at all (``tree.tell = None``, the
cache as it was before it told anything), with its publisher and nobody
listening (every gate and server run), and watched (a listener on the index
and ref events, as the history tier's ``CacheWatch``). Seconds per trace and
the two ratios to the first go to extra_info; no verdict depends on them.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from benchtrace import agentic_trace
from cachesim import cache_config

from kvwatch.engine import events
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.pool import PageLayout
from kvwatch.engine.cache.protocol import holder_of
from kvwatch.engine.config import GROUP_NAMES

AGENTS = int(os.environ.get("KVWATCH_BENCH_AGENTS", "3"))
ROUNDS = int(os.environ.get("KVWATCH_BENCH_ROUNDS", "3"))
TOLD = (events.PagesStored, events.PagesRemoved, events.RefsMoved, events.NodeSplit)


def replay(trace, how: str) -> tuple[float, int]:
    """Seconds spent in the cache for the whole trace, and the events a listener got."""
    config = cache_config(window=32, interval=256, page=16, full=65536, swa=8192, snapshots=2048)
    cache = build_cache(config, {g: PageLayout((), torch.float16) for g in GROUP_NAMES})
    got: list = []
    if how == "none":
        cache.view.tree.tell = None
    elif how == "watched":
        for kind in TOLD:
            cache._events.subscribe(kind, got.append)
    spent = 0.0
    for prompt in trace.prompts:
        holder = cache.open(list(prompt))
        t0 = time.perf_counter()
        cache.match(holder)
        n = len(holder_of(holder).tokens) - holder.computed_len
        cache.allocate(holder, n)
        cache.advance(holder, holder.computed_len + n)
        cache.commit_chunk(holder)
        cache.release(holder, commit=True)
        spent += time.perf_counter() - t0
    return spent, len(got)


@pytest.mark.bench
def test_tree_events_cost_nothing_unheard_and_little_watched(benchmark):
    trace = agentic_trace(AGENTS, ROUNDS)
    times: dict[str, list[float]] = {"none": [], "unheard": [], "watched": []}
    heard = []

    def one_round() -> None:
        for how in times:
            spent, n = replay(trace, how)
            times[how].append(spent)
            if how == "watched":
                heard.append(n)

    benchmark.pedantic(one_round, rounds=5, warmup_rounds=1)
    best = {how: min(ts) for how, ts in times.items()}
    assert min(heard) > len(trace.prompts)  # the watched runs were told every change
    benchmark.extra_info.update(
        requests=len(trace.prompts),
        seconds=best,
        unheard_over_none=round(best["unheard"] / best["none"], 3),
        watched_over_none=round(best["watched"] / best["none"], 3),
    )
