"""Exact greedy equivalence: outputs with a prefix cache equal cache-off outputs.

The oracle runs every request alone on an engine with the cache off and one
prefill chunk. The engine under test shares prefixes through the tree, chunks
prefill, batches up to 8 requests, speculates, retracts under pressure and
on demand, and aborts noise requests at random stages, while the probe
stays clean. The same holds for the snapshot-slot backend, whose slots wrap
and get evicted under pressure as the conversations grow.
"""

from __future__ import annotations

import pytest
from conversations import Chaos, Trie, oracle, run_trie, small_cache
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvwatch.engine import Engine, EngineConfig, SchedulerConfig, SpecConfig
from kvwatch.engine.config import PrefixCacheMode
from kvwatch.engine.events import SlotRestored

RADIX, SLOTS = PrefixCacheMode.RADIX, PrefixCacheMode.SLOTS


def engine_for(
    max_running: int, chunk: int, spec: bool, pressure: bool, mode: PrefixCacheMode = RADIX
) -> Engine:
    cache = (
        small_cache(full=48, swa=48, state=12, host=6, mode=mode)
        if pressure
        else small_cache(mode=mode)
    )
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
    "slots-batch1-chunk64": dict(max_running=1, chunk=64, spec=False, pressure=False, mode=SLOTS),
    "slots-batch8-chunk7-spec": dict(max_running=8, chunk=7, spec=True, pressure=False, mode=SLOTS),
    "slots-batch8-pressure-spec": dict(
        max_running=8, chunk=16, spec=True, pressure=True, mode=SLOTS
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cached_outputs_equal_cache_off(case):
    engine = engine_for(**CASES[case])
    restored = []
    engine.events.subscribe(SlotRestored, restored.append)
    assert assert_equivalent(engine, Trie(seed=7), Chaos()) >= 12
    if CASES[case].get("mode") is SLOTS:
        assert restored, "no slot was ever restored: the slots backend was not exercised"


def test_equivalence_with_forced_retractions_and_aborts():
    engine = engine_for(max_running=8, chunk=5, spec=True, pressure=True)
    chaos = Chaos(retract_every=3, noise=3, seed=1)
    assert assert_equivalent(engine, Trie(seed=8), chaos) >= 12


def test_slots_equivalence_with_forced_retractions_and_aborts():
    """Without a tree, a retracted request restarts from its last slot snapshot,
    so retractions come less often here than in the radix case, or long
    prefills would never finish between them."""
    engine = engine_for(max_running=8, chunk=16, spec=True, pressure=True, mode=SLOTS)
    restored = []
    engine.events.subscribe(SlotRestored, restored.append)
    chaos = Chaos(retract_every=5, noise=3, seed=1)
    assert assert_equivalent(engine, Trie(seed=8), chaos) >= 12
    assert restored, "no slot was ever restored: the slots backend was not exercised"


def test_equivalence_token_by_token_prefill():
    engine = engine_for(max_running=8, chunk=1, spec=True, pressure=False)
    assert_equivalent(
        engine, Trie(seed=9, conversations=2, turns=2, forks=1, system_len=40), Chaos()
    )


@pytest.mark.slow
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
    mode=st.sampled_from([RADIX, SLOTS]),
)
def test_equivalence_under_random_configs(
    max_running, chunk, spec, pressure, retract_every, noise, seed, mode
):
    assume(mode is RADIX or not retract_every)  # see the slots retraction test above
    engine = engine_for(max_running, chunk, spec, pressure, mode)
    trie = Trie(seed=seed, conversations=3, turns=2, forks=1, system_len=60)
    assert_equivalent(engine, trie, Chaos(retract_every, noise, seed))
