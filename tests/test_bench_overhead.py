"""Benchmark: engine throughput with OpenTelemetry on, divided by throughput with it off.

Two identical engines run the same agentic-trie rounds in the same process,
alternating round by round, in ABBA order, so drift in the machine hits both
alike. The overhead is one minus the median of the per-round paired ratios
(time off / time on): a burst of load from another process spoils one pair,
not the figure. The
instrumented one has every listener subscribed (counters, histograms, request
spans written to a span file) and its ``/metrics`` page rendered after each
round, as a scrape would.
"""

from __future__ import annotations

import os
import statistics
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


def run_round(engine: Engine, prompts) -> int:
    ids = [engine.add_request(list(p), PARAMS) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    return sum(len(engine.take(rid).token_ids) for rid in ids)


@pytest.mark.bench
def test_instrumentation_overhead(benchmark, tmp_path):
    trace = agentic_trace(AGENTS, ROUNDS)
    spent = {"off": 0.0, "on": 0.0}
    ratios: list[float] = []  # per round: time off / time on = throughput on / off

    def both() -> None:
        plain, traced = new_engine(), new_engine()
        telemetry = Telemetry(run_dir=tmp_path, otlp=False)
        hooks = instrument(traced.events, traced.stats, telemetry)
        order = [("off", plain), ("on", traced)]
        try:
            for prompts in trace.rounds:
                took = {}
                for name, engine in order:
                    start = time.perf_counter()
                    produced = run_round(engine, prompts)
                    if name == "on":
                        telemetry.render_metrics()
                    took[name] = time.perf_counter() - start
                    assert produced == len(prompts) * PARAMS.max_tokens
                ratios.append(took["off"] / took["on"])
                for name, seconds in took.items():
                    spent[name] += seconds
                order.reverse()
        finally:
            hooks.close()
            telemetry.shutdown()

    benchmark.pedantic(both, rounds=REPEATS)
    ratio = statistics.median(ratios)
    benchmark.extra_info.update(
        seconds_off=round(spent["off"], 3),
        seconds_on=round(spent["on"], 3),
        rounds=len(ratios),
        throughput_ratio=round(ratio, 4),
        overhead_pct=round(100 * (1 - ratio), 2),
    )
