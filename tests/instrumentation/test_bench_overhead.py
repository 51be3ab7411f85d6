"""Benchmark: engine throughput with OpenTelemetry on, divided by throughput with it off.

Two identical engines run the same agentic-trie rounds in the same process, in
lockstep: one engine step each, the order swapped every step (ABBA), each step
timed on its own. Load from other processes comes and goes over seconds, so
at step granularity it lands on both engines alike, and the sums compare the
same work. The instrumented engine has every listener subscribed (counters,
histograms, request spans written to a span file) and its ``/metrics`` page is
rendered after each round, as a scrape would. The figure is the throughput
ratio: total time off over total time on.
"""

from __future__ import annotations

import os
import time

import pytest
from benchtrace import agentic_trace
from conversations import small_cache

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig
from kvwatch.instrumentation import Telemetry, instrument

AGENTS = int(os.environ.get("KVWATCH_BENCH_AGENTS", "3"))
ROUNDS = int(os.environ.get("KVWATCH_BENCH_ROUNDS", "3"))
REPEATS = int(os.environ.get("KVWATCH_BENCH_REPEATS", "1"))
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)


def new_engine() -> Engine:
    return Engine(
        EngineConfig(
            cache=small_cache(full=8192, swa=2048, state=1024, host=0),
            scheduler=SchedulerConfig(max_running=16, chunk_size=256, max_batch_tokens=512),
        )
    )


@pytest.mark.bench
def test_instrumentation_overhead(benchmark, tmp_path):
    trace = agentic_trace(AGENTS, ROUNDS)
    spent = {"off": 0.0, "on": 0.0}

    def both() -> None:
        plain, traced = new_engine(), new_engine()
        telemetry = Telemetry(run_dir=tmp_path, otlp=False)
        hooks = instrument(traced.events, traced.stats, telemetry)
        pair = [("off", plain), ("on", traced)]
        try:
            for prompts in trace.rounds:
                ids = {}
                for name, engine in pair:
                    start = time.perf_counter()
                    ids[name] = [engine.add_request(list(p), PARAMS) for p in prompts]
                    spent[name] += time.perf_counter() - start
                while plain.has_unfinished() or traced.has_unfinished():
                    for name, engine in pair:
                        if engine.has_unfinished():
                            start = time.perf_counter()
                            engine.step()
                            spent[name] += time.perf_counter() - start
                    pair.reverse()
                start = time.perf_counter()
                telemetry.render_metrics()
                spent["on"] += time.perf_counter() - start
                for name, engine in pair:
                    produced = sum(len(engine.take(rid).token_ids) for rid in ids[name])
                    assert produced == len(prompts) * PARAMS.max_tokens
        finally:
            hooks.close()
            telemetry.shutdown()

    benchmark.pedantic(both, rounds=REPEATS)
    ratio = spent["off"] / spent["on"]
    benchmark.extra_info.update(
        seconds_off=round(spent["off"], 3),
        seconds_on=round(spent["on"], 3),
        throughput_ratio=round(ratio, 4),
        overhead_pct=round(100 * (1 - ratio), 2),
    )
