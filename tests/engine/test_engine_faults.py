"""The engine's faults: each is flagged by the probe, and the same run is clean without it."""

from __future__ import annotations

import random

import pytest
from conversations import small_cache

from kvwatch.contracts import FindingKind
from kvwatch.engine import Engine, EngineConfig, Fault, SamplingParams, SchedulerConfig, SpecConfig
from kvwatch.engine.cache.protocol import holder_of
from kvwatch.engine.config import FULL_KV, LINEAR_STATE, SWA_WINDOW
from kvwatch.engine.events import SpecVerified


def words(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(32, 127) for _ in range(n)]


# -- abort-state-buffer-leak (seed 002) -------------------------------------------------
def abort_mid_prefill(faults: frozenset, how: str) -> Engine:
    """Five long prompts are stopped mid-prefill, each holding its frontier snapshot."""
    engine = Engine(
        EngineConfig(
            cache=small_cache(),
            scheduler=SchedulerConfig(max_running=8, chunk_size=24),
            faults=faults,
        )
    )
    for i in range(5):
        rid = engine.add_request(words(200, i), SamplingParams(max_tokens=4))
        while (
            engine._requests[rid].holder is None or engine._requests[rid].holder.computed_len < 48
        ):
            engine.step()
        holder = engine._requests[rid].holder
        assert (
            holder.computed_len < 200 and holder_of(holder).track() is not None
        )  # mid-prefill, snapshot held
        engine.abort(rid) if how == "abort" else engine.pause(rid)
    return engine


@pytest.mark.parametrize("how", ["abort", "pause"])
def test_stopping_mid_prefill_frees_the_held_snapshots(how):
    report = abort_mid_prefill(frozenset(), how).probe()
    assert report.clean, report.findings


@pytest.mark.parametrize("how", ["abort", "pause"])
def test_abort_state_buffer_leak_is_flagged(how):
    report = abort_mid_prefill(frozenset({Fault.ABORT_STATE_BUFFER_LEAK}), how).probe()
    orphans = {f.group: f for f in report.findings if f.kind == FindingKind.ORPHAN}
    assert set(orphans) == {SWA_WINDOW, LINEAR_STATE}
    assert len(orphans[LINEAR_STATE].pages) == 5  # one leaked snapshot per stopped request
    assert "request" in orphans[LINEAR_STATE].detail


# -- spec-overalloc-leak (seed 001) --------------------------------------------------------
def speculate(faults: frozenset):
    """Greedy decoding with drafts; rejected drafts leave k + 1 - accepted slots behind."""
    spec = SpecConfig(num_drafts=4)
    engine = Engine(
        EngineConfig(
            cache=small_cache(),
            scheduler=SchedulerConfig(max_running=8, chunk_size=64, spec=spec),
            faults=faults,
        )
    )
    rejected = []
    engine.events.subscribe(SpecVerified, lambda e: rejected.append(e.drafts - e.accepted))
    prompt = [40, 41, 42, 43, 44] * 8 + words(20, 9)
    rid = engine.add_request(prompt, SamplingParams(max_tokens=120))
    exceeded = []
    while engine.has_unfinished():
        engine.step()
        if engine._requests[rid].holder is not None:
            exceeded.append(engine.probe().bounds[FULL_KV].exceeded)
    assert sum(rejected) > 40, "the run needs rejected drafts to show anything"
    return engine, exceeded


def test_rejected_draft_slots_are_trimmed():
    engine, exceeded = speculate(frozenset())
    assert not any(exceeded)
    assert engine.probe().clean


def test_spec_overalloc_leak_is_flagged_by_the_usage_bound():
    _engine, exceeded = speculate(frozenset({Fault.SPEC_OVERALLOC_LEAK}))
    first = exceeded.index(True)
    assert all(exceeded[first:]), "once over the bound, the request stays over it"
    assert first < len(exceeded) // 2
