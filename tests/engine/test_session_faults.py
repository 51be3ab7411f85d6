"""Seed 001's session faults: each is flagged by the probe, and the same run is clean without it.

Every turn is cut off in the middle of a verify step, so each parked slot
carries speculative slots past its computed tokens: the gap that resuming
must free, page-aligned.
"""

from __future__ import annotations

import itertools

import pytest
from conversations import oracle, small_cache
from sessionsim import SessionDriver, abort_mid_verify

from kvwatch.contracts import FindingKind
from kvwatch.engine import Engine, EngineConfig, Fault, SamplingParams, SchedulerConfig, SpecConfig
from kvwatch.engine.config import FULL_KV

PARAMS = SamplingParams(max_tokens=24)


def cut_turns(faults: frozenset, turns: int = 5):
    """Session turns cut mid-verify; returns the engine, the driver, a probe per turn,
    and the removal of the hook that cuts them."""
    engine = Engine(
        EngineConfig(
            cache=small_cache(full=512),
            scheduler=SchedulerConfig(chunk_size=16, spec=SpecConfig(num_drafts=4)),
            faults=faults,
        )
    )
    stop_cutting = engine.on_batch_computed(abort_mid_verify(engine, after_tokens=2))
    driver = SessionDriver(engine, 2, seed=11)
    reports, gaps = [], 0
    for _ in range(turns):
        driver.turn(PARAMS)
        gaps += sum(
            (h := engine._sessions.get(sid).holder).allocated_len > h.computed_len
            for sid in driver.ids
        )
        reports.append(engine.probe())
    assert gaps >= turns, "every turn should leave a speculative gap"
    return engine, driver, reports, stop_cutting


def test_resuming_frees_every_gap_and_stays_equivalent():
    _, driver, reports, stop_cutting = cut_turns(frozenset())
    assert all(r.clean for r in reports), [r.findings for r in reports]
    stop_cutting()
    for _sid, prompt, output in driver.turn(SamplingParams(max_tokens=8)):
        assert output == oracle(prompt, SamplingParams(max_tokens=8))


def test_session_tail_leak_is_flagged():
    _, driver, reports, _ = cut_turns(frozenset({Fault.SESSION_TAIL_LEAK}), turns=10)
    orphaned = [
        sum(len(f.pages) for f in r.findings if f.kind == FindingKind.ORPHAN and f.group == FULL_KV)
        for r in reports
    ]
    # A gap leaks a page whenever the drafts' slots crossed into a new page;
    # the orphans pile up turn after turn and never come back.
    assert orphaned[0] == 0  # the first gaps are only dropped when the second turn resumes
    assert all(b >= a for a, b in itertools.pairwise(orphaned)), orphaned
    assert len(set(orphaned)) >= 3 and orphaned[-1] >= 3, orphaned
    # the orphans' last owner is named by the session id its client uses, not a cache number
    detail = next(f.detail for f in reports[-1].findings if f.kind == FindingKind.ORPHAN)
    assert any(f"'session {sid}'" in detail for sid in driver.ids), detail


def test_session_tail_unaligned_free_is_flagged():
    _, _, reports, _ = cut_turns(frozenset({Fault.SESSION_TAIL_UNALIGNED_FREE}))
    kinds = {f.kind for r in reports[1:] for f in r.findings if f.group == FULL_KV}
    assert kinds & {FindingKind.FREE_AND_OWNED, FindingKind.DOUBLE_OWNED}, kinds


@pytest.mark.parametrize("fault", [Fault.SESSION_TAIL_LEAK, Fault.SESSION_TAIL_UNALIGNED_FREE])
def test_without_a_gap_the_session_faults_stay_silent(fault):
    """No speculation, no cut turns: the slot never over-allocates, nothing to free."""
    engine = Engine(EngineConfig(cache=small_cache(full=512), faults=frozenset({fault})))
    driver = SessionDriver(engine, 2, seed=12)
    for _ in range(4):
        driver.turn(SamplingParams(max_tokens=6))
        assert engine.probe().clean
