"""Each detector on hand-made runs: it fails on the leak's shape and passes without it."""

from __future__ import annotations

import random

import pytest
from probes import make_finding, make_probe

from kvwatch.contracts import FindingKind, ProbeReport
from kvwatch.gate.verdicts.detectors import (
    DETECTORS,
    FAIL,
    PASS,
    SKIPPED,
    HeapSample,
    Replay,
    RunRecord,
    Turn,
)
from kvwatch.gate.verdicts.detectors.stats import first_rise, trend
from kvwatch.gate.verdicts.detectors.verdict import not_back
from kvwatch.harness.run_record import Counts


def run_of(probes: list[ProbeReport], **kw) -> RunRecord:
    turns = tuple(
        Turn(turn=i, probes=(p,), conversations=4, context_tokens=100 * (i + 1))
        for i, p in enumerate(probes)
    )
    return RunRecord(
        turns=turns, warmup=2, baseline=probes[0], drained=kw.pop("drained", probes[0]), **kw
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
    assert v.failed and v.after_drain and v.first_turn == 6
    assert v.summary().startswith("after the drain: full.kv: 3 pages still used, 0 before")


def test_quiescence_fails_on_a_listener_finding_at_the_turn_it_appears():
    """An event handler that raised is isolated by the engine; the probe's
    ``listener`` finding is what keeps it from passing unseen."""
    broken = make_probe(findings=(make_finding(FindingKind.LISTENER, group=None),))
    v = DETECTORS["quiescence"](run_of([*CLEAN[:2], broken, *CLEAN[3:]]))
    assert v.failed and v.first_turn == 2 and "listener seen" in v.evidence[0].detail
    v = DETECTORS["quiescence"](run_of(CLEAN, drained=broken))
    assert v.failed and v.after_drain
    assert DETECTORS["quiescence"](run_of(CLEAN)).verdict == PASS
    # the other detectors leave it alone: one detector owns it
    others = [d for d in DETECTORS if d != "quiescence"]
    assert not any(DETECTORS[d](run_of([*CLEAN[:2], broken, *CLEAN[3:]])).failed for d in others)


def test_refcount_fails_on_root_drift():
    probes = [*CLEAN[:1], make_probe(root=(2, 1)), *CLEAN[2:]]
    v = DETECTORS["refcount"](run_of(probes))
    assert v.failed and v.first_turn == 1 and "root refs 2" in v.evidence[0].detail


def heap_run(per_turn) -> RunRecord:
    turns = tuple(
        Turn(
            turn=i,
            probes=(CLEAN[0],),
            conversations=4,
            context_tokens=1000 * (i + 1),
            heap=HeapSample(traced_bytes=b, top=(), by_site={"records.py:12": b}),
        )
        for i, b in enumerate(per_turn)
    )
    return RunRecord(turns=turns, warmup=2)


def test_heap_tells_o_prefix_from_o_turns_times_prefix():
    o_prefix = [80 * 1000 * (i + 1) for i in range(6)]  # 80 bytes per context token, always
    o_turns = [80 * 1000 * (i + 1) * (i + 1) for i in range(6)]  # a whole prefix more each turn
    assert DETECTORS["heap"](heap_run(o_prefix)).verdict == PASS
    v = DETECTORS["heap"](heap_run(o_turns))
    assert v.failed and v.first_turn == 5 and "records.py:12" in v.evidence[0].detail
    assert DETECTORS["heap"](run_of(CLEAN)).verdict == SKIPPED


def test_heap_judges_per_cached_token_when_the_cache_holds_more_than_the_context():
    # the conversations hold 1000 tokens; cold prompts keep filling the prefix
    # cache, and the tree's own keys grow with it: O(cache), bounded by the pool
    cached = [4000 * (i + 1) for i in range(6)]
    turns = tuple(
        Turn(
            turn=i,
            probes=(make_probe(cached_tokens=c),),
            conversations=4,
            context_tokens=1000,
            heap=HeapSample(traced_bytes=8 * c, top=(), by_site={"radix.py:69": 8 * c}),
        )
        for i, c in enumerate(cached)
    )
    assert DETECTORS["heap"](RunRecord(turns=turns, warmup=2)).verdict == PASS
    # the same memory against the context alone looks like a leak
    blind = tuple(t._replace(probes=(CLEAN[0],)) for t in turns)
    assert DETECTORS["heap"](RunRecord(turns=blind, warmup=2)).failed


def test_heap_judges_per_context_token_too_when_the_cache_grows_slower():
    """rl-rollout at c = 1 with failpoints on (figures of one run): a session's last
    two routed-expert blobs scale with its context, while cold sampled prompts keep
    the cache ahead of the context and growing slower. Per held token the clean
    blobs climb; per context token they are flat. Keeping every blob climbs on both."""
    context = [41, 94, 159, 219, 304, 363, 406]
    cached = [192, 288, 336, 400, 480, 592, 640]
    clean = [784, 2416, 4352, 6352, 8672, 10976, 12608]
    leak = [784, 2416, 5088, 8720, 13712, 19648, 26272]

    def run(kept: list[int]) -> RunRecord:
        turns = tuple(
            Turn(
                turn=i + 1,
                probes=(make_probe(cached_tokens=c),),
                conversations=1,
                context_tokens=x,
                heap=HeapSample(traced_bytes=60_000 + b, top=(), by_site={"records.py:159": b}),
            )
            for i, (x, c, b) in enumerate(zip(context, cached, kept, strict=True))
        )
        return RunRecord(turns=turns, warmup=2)

    assert DETECTORS["heap"](run(clean)).verdict == PASS
    v = DETECTORS["heap"](run(leak))
    assert v.failed and "records.py:159" in v.evidence[0].detail


def test_heap_does_not_pair_a_rising_site_with_a_buffer_seen_once():
    """session-blob-retention at c = 1 (one run's figures): a span file's write
    buffer held 26 KB at the first judged sample only; judged together with it,
    the leaking blob site looked flat and the leak passed."""
    context = [169, 210, 263, 328, 388, 473, 532, 575]
    cached = [112, 192, 288, 336, 400, 480, 592, 640]
    blobs = [2832, 6320, 10656, 16032, 22368, 30064, 38704, 48032]
    buffer = [0, 0, 26896, 0, 0, 0, 0, 0]
    turns = tuple(
        Turn(
            turn=i,
            probes=(make_probe(cached_tokens=c),),
            conversations=1,
            context_tokens=x,
            heap=HeapSample(
                traced_bytes=80_000 + b + f,
                top=(),
                by_site={"records.py:159": b, **({"spanfile.py:25": f} if f else {})},
            ),
        )
        for i, (x, c, b, f) in enumerate(zip(context, cached, blobs, buffer, strict=True))
    )
    v = DETECTORS["heap"](RunRecord(turns=turns, warmup=2))
    assert v.failed and "records.py:159" in v.evidence[0].detail


def test_heap_needs_a_site_to_grow_by_more_than_a_few_kilobytes():
    def run(scale: int) -> RunRecord:
        kept = [640, 640, 640, 2432, 3136, 3648]  # a monotone run of chance at one small site
        turns = tuple(
            Turn(
                turn=i,
                probes=(CLEAN[0],),
                conversations=1,
                context_tokens=200,
                heap=HeapSample(traced_bytes=100_000, top=(), by_site={"sched.py:205": scale * b}),
            )
            for i, b in enumerate(kept)
        )
        return RunRecord(turns=turns, warmup=2)

    assert DETECTORS["heap"](run(1)).verdict == PASS
    v = DETECTORS["heap"](run(4))
    assert v.failed and "sched.py:205" in v.evidence[0].detail


def sites_run(context: list[int], by_site: dict[str, list[int]], traced: list[int]) -> RunRecord:
    """A run whose heap samples hold these sites' sizes, turn by turn."""
    turns = tuple(
        Turn(
            turn=i,
            probes=(CLEAN[0],),
            conversations=1,
            context_tokens=c,
            heap=HeapSample(
                traced_bytes=traced[i],
                top=(),
                by_site={site: sizes[i] for site, sizes in by_site.items()},
            ),
        )
        for i, c in enumerate(context)
    )
    return RunRecord(turns=turns, warmup=2)


def test_heap_judges_a_list_that_moves_between_sites_as_one():
    # two sessions' token lists, decoded at one line and extended at another:
    # tracemalloc files each under the line that last grew it (seed 7, c = 2)
    context = [699, 967, 1258, 1546, 1796, 2079]
    extended = [0, 2016, 2496, 6528, 11744, 14400]
    decoded = [6144, 6304, 8512, 7008, 4000, 3936]

    def run(decoded: list[int]) -> RunRecord:
        return sites_run(context, {"e.py:187": extended, "s.py:205": decoded}, [60_000] * 6)

    assert DETECTORS["heap"](run(decoded)).verdict == PASS
    # the same growth with nothing lost elsewhere is kept memory
    v = DETECTORS["heap"](run([6144] * 6))
    assert v.failed and "e.py:187" in v.evidence[0].detail


def test_heap_counts_what_a_site_lent_from_its_peak():
    """rl-rollout at c = 8, seed 1 (one run's figures): the sessions' token lists
    move from the decode line to the extend line as they grow, while new ones
    keep the decode line growing too, so it ends only 5.7 kB below where it
    started though it lent 8 kB from its peak. Together the two sites are flat
    per context token (8.6 to 8.8 bytes): judged apart, the extend line looked
    like a leak."""
    context = [980, 1516, 2125, 2663, 3219, 3752, 4291, 4901]
    extended = [0, 0, 2112, 5824, 9728, 24256, 23104, 32352]
    decoded = [8160, 12992, 16096, 17440, 18560, 8896, 14240, 10432]
    traced = [100_000 + 80 * c for c in context]

    def run(decoded: list[int]) -> RunRecord:
        return sites_run(context, {"records.py:132": extended, "scheduler.py:226": decoded}, traced)

    assert DETECTORS["heap"](run(decoded)).verdict == PASS
    # the same extend line with nothing lent from the decode line is kept memory
    v = DETECTORS["heap"](run([8160, 12992, 16096, 17440, 18560, 18560, 18560, 18560]))
    assert v.failed and "records.py:132" in v.evidence[0].detail


def test_gauge_trend_on_black_box_series():
    rng = random.Random(3)
    flat = [{"usage": 0.5 + rng.uniform(-0.05, 0.05)} for _ in range(8)]
    rising = [{"usage": 0.2 + 0.05 * i} for i in range(8)]
    for series, want in ((flat, PASS), (rising, FAIL)):
        turns = tuple(Turn(turn=i, probes=(), gauges=g) for i, g in enumerate(series))
        assert DETECTORS["gauge-trend"](RunRecord(turns=turns, warmup=2)).verdict == want


def test_equivalence_names_the_first_differing_token():
    good = Replay(turn=3, prompt=(1, 2, 3), cached=(5, 6, 7), reference=(5, 6, 7))
    bad = Replay(turn=4, prompt=(1, 2, 3), cached=(5, 6, 9), reference=(5, 6, 7))
    assert DETECTORS["equivalence"](RunRecord(turns=(), warmup=2, replays=(good,))).verdict == PASS
    v = DETECTORS["equivalence"](RunRecord(turns=(), warmup=2, replays=(good, bad)))
    assert v.failed and v.first_turn == 4 and "at token 2" in v.evidence[0].detail


def test_trend_statistics():
    assert trend([1, 2, 3, 4, 5]).p_value < 0.05
    noisy = [10, 12, 9, 11, 10, 12, 9, 11]
    assert first_rise(list(range(8)), noisy, warmup=2) is None
    steady = [10 + 2 * i for i in range(8)]
    assert first_rise(list(range(8)), steady, warmup=2)[0] == 5  # 4 turns after the warm-up


def test_requests_fails_at_the_first_barrier_whose_counts_hold_a_failure_or_a_5xx():
    ok = Counts(status={"2xx": 10}, failed=0, broken_turns=0)
    bad = Counts(
        status={"2xx": 12, "5xx": 1},
        failed=1,
        broken_turns=0,
        first_failures=({"name": "chat", "status": 500, "body": "boom"},),
    )
    turns = [Turn(turn=i, probes=(CLEAN[0],), requests=c) for i, c in enumerate([ok, ok, bad, bad])]
    v = DETECTORS["requests"](RunRecord(turns=tuple(turns), warmup=2, requests=bad))
    assert v.failed and v.first_turn == 2
    assert "1 of 13 requests failed, 1 answered 5xx" in v.evidence[0].detail
    assert "chat: HTTP 500 boom" in v.evidence[1].detail
    clean = [t._replace(requests=ok) for t in turns]
    assert (
        DETECTORS["requests"](RunRecord(turns=tuple(clean), warmup=2, requests=ok)).verdict == PASS
    )
    # a failure counted only at the end belongs after the last turn
    late = DETECTORS["requests"](
        RunRecord(
            turns=tuple(clean),
            warmup=2,
            requests=Counts(status={"none": 1}, failed=1, broken_turns=0),
        )
    )
    assert late.failed and late.first_turn == 4 and late.after_drain
    assert DETECTORS["requests"](RunRecord(turns=tuple(clean), warmup=2)).verdict == SKIPPED
    broke = RunRecord(
        turns=tuple(turns), warmup=2, requests=bad, error="the engine stopped answering"
    )
    assert DETECTORS["requests"](broke).verdict == SKIPPED  # the gate's error, exit 3


def test_the_drain_rule_flags_what_is_above_its_value_before_the_run():
    assert not_back({"a": 3, "b": 1.0}, {"a": 3, "b": 0.5, "c": 9}) == []  # lower is fine
    assert not_back({"a": 3, "b": 1.0}, {"a": 4, "b": 1.0}) == [("a", 3, 4)]
    live = make_probe()._replace(stats=make_probe().stats._replace(live_sessions=2))
    v = DETECTORS["allocator"](run_of(CLEAN, drained=live))
    assert v.failed and "2 live sessions left, 0 before" in v.evidence[0].detail


def test_heap_left_per_closed_session_fails_where_per_request_does_not():
    """A site that kept 5 KB in 10 allocations after 8 sessions closed, over 1000
    requests: far under the per-request threshold, over the per-session one."""
    from kvwatch.harness.run_record import Counts, SiteGrowth

    def probe(closed: int):
        base = make_probe()
        return base._replace(stats=base.stats._replace(sessions_closed=closed))

    def run(size: int) -> RunRecord:
        sent = Counts(status={"2xx": 1000}, failed=0, broken_turns=0)
        early = Counts(status={"2xx": 10}, failed=0, broken_turns=0)
        turns = tuple(
            Turn(turn=t, probes=(probe(0),), requests=early if t == 1 else None) for t in range(4)
        )
        end = HeapSample(traced_bytes=0, since_mark=(SiteGrowth("records.py:9", size, 10),))
        return RunRecord(turns=turns, warmup=2, drained=probe(8), requests=sent, heap_end=end)

    v = DETECTORS["heap"](run(5000))
    assert v.failed and v.after_drain
    assert "bytes per closed session (8 since turn 1)" in v.evidence[0].detail
    assert DETECTORS["heap"](run(1000)).verdict == PASS  # under 4 KiB in all


def test_a_failure_tells_how_it_grew_first_turn_last_turn_after_the_drain():
    """The evidence names what was first seen; the story says it went from 1 to 10
    leaked pages over the turns and stayed at 10 once drained."""
    from kvwatch.contracts import finding

    def leaking(n: int):
        f = finding(
            FindingKind.ORPHAN, "full.kv", list(range(n)), f"{n} allocated pages held by no one"
        )
        return make_probe(findings=(f,))

    turns = tuple(Turn(turn=t, probes=(leaking(1 + t * 9 // 5),)) for t in range(6))
    v = DETECTORS["allocator"](RunRecord(turns=turns, warmup=2, drained=leaking(10)))
    assert v.failed and v.first_turn == 0
    assert v.story == "full.kv leaked pages 1 -> 10 over turns 0-5, 10 after the drain"
    assert v.as_dict()["story"] == v.story
    from kvwatch.gate.verdicts.detectors.verdict import Verdict as V

    assert V.from_json("allocator", v.as_dict()).story == v.story
