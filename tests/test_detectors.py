"""Each detector on hand-made runs: it fails on the leak's shape and passes without it."""

from __future__ import annotations

import random

import pytest
from probes import make_finding, make_probe

from kvwatch.contracts import FindingKind, ProbeReport
from kvwatch.instrumentation.detectors import (
    DETECTORS,
    FAIL,
    PASS,
    SKIPPED,
    HeapSample,
    Replay,
    RunRecord,
    Turn,
)
from kvwatch.instrumentation.detectors.stats import first_rise, trend


def run_of(probes: list[ProbeReport], **kw) -> RunRecord:
    turns = tuple(
        Turn(i, (p,), conversations=4, context_tokens=100 * (i + 1)) for i, p in enumerate(probes)
    )
    return RunRecord(
        turns, warmup=2, baseline=probes[0], drained=kw.pop("drained", probes[0]), **kw
    )


CLEAN = [make_probe() for _ in range(6)]


@pytest.mark.parametrize(
    ("detector", "kind"),
    [
        ("allocator", FindingKind.ORPHAN),
        ("allocator", FindingKind.DOUBLE_OWNED),
        ("allocator", FindingKind.FREE_AND_OWNED),
        ("refcount", FindingKind.REF_MISMATCH),
        ("tree", FindingKind.TREE),
        ("slot-table", FindingKind.SLOT_TABLE),
    ],
)
def test_findings_fail_at_the_turn_they_appear(detector, kind):
    probes = [*CLEAN[:3], make_probe(findings=(make_finding(kind),)), *CLEAN[4:]]
    verdict = DETECTORS[detector](run_of(probes))
    assert verdict.verdict == FAIL and verdict.first_turn == 3
    assert verdict.evidence[0].pages == (7, 8) and kind in verdict.evidence[0].detail
    assert DETECTORS[detector](run_of(CLEAN)).verdict == PASS


def test_allocator_fails_on_an_exceeded_bound_a_rising_interior_count_and_a_bad_drain():
    over = [*CLEAN[:2], make_probe(exceeded="linear.state"), *CLEAN[3:]]
    v = DETECTORS["allocator"](run_of(over))
    assert v.failed and v.first_turn == 2 and v.evidence[0].group == "linear.state"
    rising = [make_probe(interior=4 * i) for i in range(6)]
    v = DETECTORS["allocator"](run_of(rising))
    assert v.failed and v.first_turn == 5 and "interior snapshots" in v.evidence[0].detail
    flat = [make_probe(interior=4 + (i % 2)) for i in range(6)]
    assert DETECTORS["allocator"](run_of(flat)).verdict == PASS
    v = DETECTORS["allocator"](run_of(CLEAN, drained=make_probe(used=3)))
    assert v.failed and "after drain" in v.evidence[0].detail


def test_refcount_fails_on_root_drift():
    probes = [*CLEAN[:1], make_probe(root=(2, 1)), *CLEAN[2:]]
    v = DETECTORS["refcount"](run_of(probes))
    assert v.failed and v.first_turn == 1 and "root refs 2" in v.evidence[0].detail


def heap_run(per_turn) -> RunRecord:
    turns = tuple(
        Turn(i, (CLEAN[0],), 4, 1000 * (i + 1), HeapSample(b, (), {"records.py:12": b}))
        for i, b in enumerate(per_turn)
    )
    return RunRecord(turns, 2)


def test_heap_tells_o_prefix_from_o_turns_times_prefix():
    o_prefix = [80 * 1000 * (i + 1) for i in range(6)]  # 80 bytes per context token, always
    o_turns = [80 * 1000 * (i + 1) * (i + 1) for i in range(6)]  # a whole prefix more each turn
    assert DETECTORS["heap"](heap_run(o_prefix)).verdict == PASS
    v = DETECTORS["heap"](heap_run(o_turns))
    assert v.failed and v.first_turn == 5 and "records.py:12" in v.evidence[0].detail
    assert DETECTORS["heap"](run_of(CLEAN)).verdict == SKIPPED


def test_gauge_trend_on_black_box_series():
    rng = random.Random(3)
    flat = [{"usage": 0.5 + rng.uniform(-0.05, 0.05)} for _ in range(8)]
    rising = [{"usage": 0.2 + 0.05 * i} for i in range(8)]
    for series, want in ((flat, PASS), (rising, FAIL)):
        turns = tuple(Turn(i, (), gauges=g) for i, g in enumerate(series))
        assert DETECTORS["gauge-trend"](RunRecord(turns, 2)).verdict == want


def test_equivalence_names_the_first_differing_token():
    good = Replay(3, (1, 2, 3), (5, 6, 7), (5, 6, 7))
    bad = Replay(4, (1, 2, 3), (5, 6, 9), (5, 6, 7))
    assert DETECTORS["equivalence"](RunRecord((), 2, replays=(good,))).verdict == PASS
    v = DETECTORS["equivalence"](RunRecord((), 2, replays=(good, bad)))
    assert v.failed and v.first_turn == 4 and "at token 2" in v.evidence[0].detail


def test_trend_statistics():
    assert trend([1, 2, 3, 4, 5]).p_value < 0.05
    noisy = [10, 12, 9, 11, 10, 12, 9, 11]
    assert first_rise(list(range(8)), noisy, warmup=2) is None
    steady = [10 + 2 * i for i in range(8)]
    assert first_rise(list(range(8)), steady, warmup=2)[0] == 5  # 4 turns after the warm-up
