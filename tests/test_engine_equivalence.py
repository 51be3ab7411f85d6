"""Exact greedy equivalence: outputs with the radix cache equal cache-off outputs.

The oracle runs every request alone on an engine with the cache off and one
prefill chunk. The engine under test shares prefixes through the tree, chunks
prefill, batches up to 8 requests, speculates, retracts under pressure and
on demand, and aborts noise requests at random stages, while the probe
stays clean.
"""

from __future__ import annotations

import pytest
from conversations import Chaos, Trie, oracle, run_trie, small_cache
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvwatch.engine import Engine, EngineConfig, SchedulerConfig, SpecConfig


def engine_for(max_running: int, chunk: int, spec: bool, pressure: bool) -> Engine:
    cache = small_cache(full=48, swa=48, state=12, host=6) if pressure else small_cache()
    sched = SchedulerConfig(
        max_running=max_running,
        chunk_size=chunk,
        max_batch_tokens=max(chunk, 8) * 4,
        spec=SpecConfig(num_drafts=4) if spec else None,
    )
    return Engine(EngineConfig(cache=cache, scheduler=sched))


def assert_equivalent(engine: Engine, trie: Trie, chaos: Chaos) -> int:
    results = run_trie(engine, trie, chaos)
    for prompt, output in results:
        assert output == oracle(prompt), f"cached output differs for a {len(prompt)}-token prompt"
    report = engine.probe()
    assert report.clean, report.findings
    return len(results)


CASES = {
    "batch1-chunk64": dict(max_running=1, chunk=64, spec=False, pressure=False),
    "batch2-chunk3": dict(max_running=2, chunk=3, spec=False, pressure=False),
    "batch4-chunk16-spec": dict(max_running=4, chunk=16, spec=True, pressure=False),
    "batch8-chunk7-spec": dict(max_running=8, chunk=7, spec=True, pressure=False),
    "batch8-pressure-spec": dict(max_running=8, chunk=16, spec=True, pressure=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cached_outputs_equal_cache_off(case):
    engine = engine_for(**CASES[case])
    assert assert_equivalent(engine, Trie(seed=7), Chaos()) >= 12


def test_equivalence_with_forced_retractions_and_aborts():
    engine = engine_for(max_running=8, chunk=5, spec=True, pressure=True)
    chaos = Chaos(retract_every=3, noise=3, seed=1)
    assert assert_equivalent(engine, Trie(seed=8), chaos) >= 12


def test_equivalence_token_by_token_prefill():
    engine = engine_for(max_running=8, chunk=1, spec=True, pressure=False)
    assert_equivalent(
        engine, Trie(seed=9, conversations=2, turns=2, forks=1, system_len=40), Chaos()
    )


@settings(
    max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    max_running=st.integers(1, 8),
    chunk=st.integers(2, 80),
    spec=st.booleans(),
    pressure=st.booleans(),
    retract_every=st.sampled_from([0, 0, 2, 5]),
    noise=st.integers(0, 2),
    seed=st.integers(0, 1000),
)
def test_equivalence_under_random_configs(
    max_running, chunk, spec, pressure, retract_every, noise, seed
):
    engine = engine_for(max_running, chunk, spec, pressure)
    trie = Trie(seed=seed, conversations=3, turns=2, forks=1, system_len=60)
    assert_equivalent(engine, trie, Chaos(retract_every, noise, seed))
