"""Benchmark: how close the prefix cache comes to computing each unique token once.

The agentic-trie trace (benchtrace.py) runs round by round through an engine
whose pools hold the whole workload. Every prefill chunk the engine computes
is counted (``PrefillChunk`` events); the ratio to the trace's unique prompt
tokens is 1.0 for an ideal cache. Page alignment (the partial last page is
recomputed) and state snapshots only at page boundaries put it above 1: the
trace's page-aligned ideal is reported beside it, the floor for any cache
that resumes at page boundaries. It runs at the engine's 16-token pages and
at 8-token pages, and again without shared-prefix waits (prefix_wait.py) to
show what they save.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from benchtrace import Trace, agentic_trace
from conversations import small_cache

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig
from kvwatch.engine.events import PrefillChunk

AGENTS = int(os.environ.get("KVWATCH_BENCH_AGENTS", "3"))
ROUNDS = int(os.environ.get("KVWATCH_BENCH_ROUNDS", "3"))
PARAMS = SamplingParams(max_tokens=1)  # the reply comes from the trace, not the model
WORKLOAD_TOKENS = 8192 * 16  # full.kv room for the whole trace


def computed_tokens(trace: Trace, page: int, waits: bool = True) -> int:
    base = small_cache(full=8192, swa=2048, state=1024, host=0)
    full_kv = replace(base.full_kv, page_size=page, capacity=WORKLOAD_TOKENS // page)
    scheduler = SchedulerConfig(
        max_running=16, chunk_size=256, max_batch_tokens=512, prefix_waits=waits
    )
    engine = Engine(EngineConfig(cache=replace(base, full_kv=full_kv), scheduler=scheduler))
    computed = []
    engine.events.subscribe(PrefillChunk, lambda e: computed.append(e.tokens))
    for prompts in trace.rounds:
        ids = [engine.add_request(list(p), PARAMS) for p in prompts]
        while engine.has_unfinished():
            engine.step()
        for rid in ids:
            assert engine.take(rid).error is None
    assert not engine.probe().findings
    return sum(computed)


@pytest.mark.bench
@pytest.mark.parametrize("page", [16, 8])
def test_prefill_computed_against_unique_tokens(benchmark, page):
    trace = agentic_trace(AGENTS, ROUNDS)
    computed = benchmark.pedantic(computed_tokens, args=(trace, page), rounds=1)
    without_waits = computed_tokens(trace, page, waits=False)
    unique, total = trace.unique_tokens(), trace.total_tokens()
    aligned = trace.page_aligned_tokens(page)
    benchmark.extra_info.update(
        page=page,
        prompt_tokens=total,
        unique_tokens=unique,
        page_aligned_ideal=aligned,
        computed_tokens=computed,
        ratio=round(computed / unique, 3),
        ratio_to_page_aligned_ideal=round(computed / aligned, 3),
        computed_without_waits=without_waits,
    )
    assert unique <= aligned <= computed <= without_waits <= total
    assert computed == aligned  # every request resumes at the last page boundary it shares
