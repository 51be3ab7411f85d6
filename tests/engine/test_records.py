"""Session records (seed 003): per-turn records, merge, rollback, blob retention."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
from conversations import small_cache
from sessionsim import SessionDriver

from kvwatch.engine import Engine, EngineConfig, Fault, SamplingParams, SchedulerConfig
from kvwatch.engine.config import MAX_ROLLBACK
from kvwatch.engine.errors import SessionError
from kvwatch.engine.records import SessionRecords, TurnRecord

PARAMS = SamplingParams(max_tokens=8)


def turn_record(turn, prompt_len, output_ids, logprobs, routed_experts) -> TurnRecord:
    return TurnRecord(
        turn=turn,
        prompt_len=prompt_len,
        output_ids=output_ids,
        logprobs=logprobs,
        routed_experts=routed_experts,
    )


def blob(n: int, fill: int) -> np.ndarray:
    return np.full((n, 4, 2), fill, dtype=np.int16)


def test_merge_takes_the_last_record_and_marks_every_output():
    records = SessionRecords()
    tokens = [1, 2, 3, 10, 11, 4, 5, 12, 13, 14]
    records.append(turn_record(0, 3, (10, 11), (-0.1, -0.2), blob(4, 1)))
    records.append(turn_record(1, 7, (12, 13, 14), (-0.3, -0.4, -0.5), blob(9, 2)))
    merged = records.merge(tokens)
    assert merged.token_ids == tokens
    assert merged.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert merged.logprobs[3:5] == [-0.1, -0.2] and merged.logprobs[7:] == [-0.3, -0.4, -0.5]
    assert np.array_equal(merged.routed_experts, blob(9, 2))


def test_only_records_that_can_become_the_tail_keep_their_blob():
    kept, every = SessionRecords(), SessionRecords(keep_every_blob=True)
    for turn in range(5):
        for records in (kept, every):
            records.append(turn_record(turn, turn * 4, (1,), (-1.0,), blob(turn * 4 + 1, turn)))
    assert [r.routed_experts is not None for r in kept.records] == [False] * (4 - MAX_ROLLBACK) + [
        True
    ] * (MAX_ROLLBACK + 1)
    assert all(r.routed_experts is not None for r in every.records)
    assert kept.blob_bytes < every.blob_bytes


def test_rollback_outside_its_range_is_an_error_and_changes_nothing():
    records = SessionRecords()
    records.append(turn_record(0, 3, (9,), (-1.0,), None))
    before = list(records.records)
    for steps in (0, MAX_ROLLBACK + 1):
        with pytest.raises(SessionError, match="rolls back"):
            records.rollback(steps)
    assert records.records == before
    records.rollback(1)
    with pytest.raises(SessionError, match="has 0 records"):
        records.rollback(1)


def recorded_run(faults: frozenset, turns: int, *, rollback_at: int | None = None):
    engine = Engine(
        EngineConfig(
            cache=small_cache(full=1024),
            scheduler=SchedulerConfig(max_running=8, chunk_size=32),
            faults=faults,
        )
    )
    driver = SessionDriver(engine, 1, seed=7, record=True, routed_experts=True, system_len=40)
    sid = driver.ids[0]
    for turn in range(turns):
        driver.turn(PARAMS, user_len=(20, 30))
        if turn == rollback_at:
            engine.rollback_session(sid, 1)
            driver.history[sid] = list(engine.session_tokens(sid))
    return engine, sid


def test_merged_blob_after_rollback_and_pruning_is_byte_identical_to_keeping_everything():
    pruned, sid = recorded_run(frozenset(), 6, rollback_at=4)
    baseline, bid = recorded_run(frozenset({Fault.SESSION_BLOB_RETENTION}), 6, rollback_at=4)
    a, b = pruned.trajectory(sid), baseline.trajectory(bid)
    assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask and a.logprobs == b.logprobs
    assert a.routed_experts.tobytes() == b.routed_experts.tobytes()
    assert a.routed_experts.shape[0] == len(a.token_ids) - 1  # every computed token
    # A rollback right after pruning promotes a record that still has its blob.
    pruned.rollback_session(sid, 1)
    baseline.rollback_session(bid, 1)
    a, b = pruned.trajectory(sid), baseline.trajectory(bid)
    assert a.routed_experts is not None and a.routed_experts.tobytes() == b.routed_experts.tobytes()


def retained_bytes_per_context_token(faults: frozenset, turns: int) -> list[float]:
    """tracemalloc's view of what the session's records keep, over live context tokens."""
    engine = Engine(
        EngineConfig(
            cache=small_cache(full=2048), scheduler=SchedulerConfig(chunk_size=64), faults=faults
        )
    )
    driver = SessionDriver(engine, 1, seed=8, record=True, routed_experts=True, system_len=40)
    sid = driver.ids[0]
    where = [
        tracemalloc.Filter(True, "*/engine/scheduler.py"),
        tracemalloc.Filter(True, "*/engine/records.py"),
    ]
    series = []
    tracemalloc.start()
    try:
        for _ in range(turns):
            driver.turn(PARAMS, user_len=(30, 30))
            gc.collect()
            retained = sum(
                s.size
                for s in tracemalloc.take_snapshot().filter_traces(where).statistics("filename")
            )
            series.append(retained / engine.session_info(sid).tokens)
    finally:
        tracemalloc.stop()
    assert engine.probe().record_bytes > 0
    return series


def slope(series: list[float]) -> float:
    """Least-squares growth per turn, after four warm-up turns."""
    tail = series[4:]
    return float(np.polyfit(np.arange(len(tail)), tail, 1)[0])


def test_retained_record_bytes_stay_o_prefix():
    series = retained_bytes_per_context_token(frozenset(), 16)
    assert abs(slope(series)) < 0.5, series  # flat per context token: O(prefix)


@pytest.mark.slow
def test_session_blob_retention_grows_o_turns_times_prefix():
    clean = retained_bytes_per_context_token(frozenset(), 16)
    leaking = retained_bytes_per_context_token(frozenset({Fault.SESSION_BLOB_RETENTION}), 16)
    assert slope(leaking) > 4, leaking  # per context token it keeps growing: O(turns x prefix)
    assert leaking[-1] > 3 * clean[-1]
