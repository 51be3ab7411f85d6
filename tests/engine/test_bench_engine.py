"""Benchmark: engine decode throughput at batch 1 and 8 on CPU.

Each round starts from requests that have finished prefill, then times
DECODE steps; tokens/s is recorded in the benchmark's extra_info. `make test`
runs it once as a smoke; `make bench` measures it.
"""

from __future__ import annotations

import random
import time

import pytest
from conversations import small_cache

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig

DECODE = 32


def prefilled(batch: int) -> Engine:
    engine = Engine(
        EngineConfig(cache=small_cache(full=1024), scheduler=SchedulerConfig(max_running=8))
    )
    rng = random.Random(batch)
    params = SamplingParams(max_tokens=DECODE + 2, ignore_eos=True)
    ids = [
        engine.add_request([rng.randrange(32, 127) for _ in range(64)], params)
        for _ in range(batch)
    ]
    while any(not engine.request_info(r).output_tokens for r in ids):
        engine.step()
    return engine


@pytest.mark.bench
@pytest.mark.parametrize("batch", [1, 8])
def test_decode_throughput(benchmark, batch):
    rates = []

    def decode(engine: Engine) -> int:
        start, produced = time.perf_counter(), 0
        for _ in range(DECODE):
            produced += sum(len(out.new_token_ids) for out in engine.step())
        rates.append(produced / (time.perf_counter() - start))
        return produced

    produced = benchmark.pedantic(decode, setup=lambda: ((prefilled(batch),), {}), rounds=3)
    assert produced == batch * DECODE
    benchmark.extra_info.update(batch=batch, tokens_per_s=round(max(rates), 1))


def _serve(engine: Engine, prompts: list[list[int]], params: SamplingParams, c: int) -> int:
    """Keep ``c`` requests in flight until every prompt is done; tokens generated."""
    pending, live, produced = list(prompts), set(), 0
    while pending or live:
        while pending and len(live) < c:
            live.add(engine.add_request(pending.pop(0), params))
        engine.step()
        for rid in [r for r in live if engine.request_info(r).done]:
            produced += len(engine.take(rid).token_ids)
            live.discard(rid)
    return produced


@pytest.mark.bench
def test_continuous_batching_c8_against_c1(benchmark):
    """Aggregate tokens/s of the same 8 requests, one at a time and 8 in flight
    (prefill included), measured in the same run."""
    rng = random.Random(0)
    prompts = [[rng.randrange(32, 127) for _ in range(64)] for _ in range(8)]
    params = SamplingParams(max_tokens=DECODE, ignore_eos=True)
    rates: dict[int, list[float]] = {1: [], 8: []}

    def both() -> None:
        for c in (1, 8):
            engine = Engine(
                EngineConfig(cache=small_cache(full=1024), scheduler=SchedulerConfig(max_running=8))
            )
            start = time.perf_counter()
            produced = _serve(engine, prompts, params, c)
            rates[c].append(produced / (time.perf_counter() - start))
            assert produced == len(prompts) * DECODE

    benchmark.pedantic(both, rounds=3, warmup_rounds=1)
    c1, c8 = max(rates[1]), max(rates[8])
    benchmark.extra_info.update(
        c1_tokens_per_s=round(c1, 1), c8_tokens_per_s=round(c8, 1), ratio=round(c8 / c1, 2)
    )
