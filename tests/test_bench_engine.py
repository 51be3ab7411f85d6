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
    while any(not engine.requests[r].output_ids for r in ids):
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
