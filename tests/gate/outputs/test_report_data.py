"""What the report draws, from hand-made records and Locust rows: leaked pages
counted from orphan findings, the tree's pages split into pinned and evictable,
the probe before the load and the drained probe around the turns, empty
groups left out, and one latency row per profile with gaps where a run has none."""

from __future__ import annotations

import math

import pytest

from kvwatch.contracts import (
    MAX_PAGES,
    Bound,
    EngineStats,
    Finding,
    FindingKind,
    GroupReport,
    ProbeReport,
    QueueReport,
    RootRefs,
    TreeReport,
)
from kvwatch.gate.outputs import report_pool
from kvwatch.gate.outputs.report import write_report
from kvwatch.gate.outputs.report_data import (
    latency_series,
    leaked_pages,
    pool_series,
    step_series,
)
from kvwatch.gate.outputs.summary import GateSummary
from kvwatch.gate.verdicts.judge import RunResult
from kvwatch.harness.run_record import RunRecord, Turn

GROUPS = ("full.kv", "swa.kv", "swa.window", "linear.state")


def probe(
    step: int, full: dict[str, int] | None = None, *, evictable: int = 0, findings=(), pinned=(0, 0)
):
    """An engine whose full.kv holds ``full`` by owner; the other groups hold nothing."""
    full = full or {}
    groups = {
        g: GroupReport(
            family="history",
            capacity=100,
            free=100 - (sum(full.values()) if g == "full.kv" else 0),
            by_owner=dict(full) if g == "full.kv" else {},
            evictable=evictable if g == "full.kv" else 0,
            host_capacity=0,
        )
        for g in GROUPS
    }
    tree = TreeReport(nodes=0, snapshots={}, host_snapshots=0, interior_snapshots={}, tokens=0)
    stats = EngineStats(
        step=step,
        live_requests=0,
        live_sessions=0,
        groups=groups,
        root_refs=RootRefs(0, 0),
        tree=tree,
        queue=QueueReport(waiting=0, running=0, retracted=0, paused=0),
        record_bytes=0,
    )
    bounds = {
        "full.kv": Bound(group="full.kv", pinned=pinned[0], limit=pinned[1], shared=0, holders=1)
    }
    return ProbeReport(stats=stats, findings=tuple(findings), bounds=bounds)


def orphan(pages: list[int], detail: str = "", group: str = "full.kv") -> Finding:
    return Finding(
        kind=FindingKind.ORPHAN,
        group=group,
        pages=tuple(pages),
        detail=detail or f"{group}: {len(pages)} allocated pages held by no live holder",
    )


def record() -> RunRecord:
    """Turns 0..2; a page leaks mid-turn 1 (orphan, not yet at its barrier), and
    3 pages are still leaked at turn 2's barrier and after the drain."""
    three = orphan([5, 6, 7])
    turns = (
        Turn(
            turn=0,
            probes=(probe(3, {"session": 4}), probe(5, {"session": 6, "tree": 4}, evictable=3)),
        ),
        Turn(
            turn=1,
            probes=(
                probe(8, {"session": 7}, findings=[orphan([5])], pinned=(9, 7)),
                probe(9, {"session": 7}),
            ),
        ),
        Turn(turn=2, probes=(probe(12, {"session": 9}, findings=[three]),)),
    )
    return RunRecord(
        turns=turns, baseline=probe(0), drained=probe(15, {"session": 3}, findings=[three])
    )


def test_leaked_pages_are_the_orphan_findings_of_the_group():
    p = probe(
        1,
        findings=[
            orphan([1, 2]),
            orphan([9], group="swa.kv"),
            Finding(
                kind=FindingKind.DOUBLE_OWNED, group="full.kv", pages=(3,), detail="held twice"
            ),
        ],
    )
    assert leaked_pages(p, "full.kv") == 2  # not the double-owned page, not swa.kv's
    assert leaked_pages(p, "swa.kv") == 1
    assert leaked_pages(probe(1), "full.kv") == 0


def test_a_finding_cut_at_max_pages_is_counted_from_its_detail():
    cut = orphan(
        list(range(MAX_PAGES)),
        "full.kv: 70 allocated pages held by no live holder; last owners {}",
    )
    assert leaked_pages(probe(1, findings=[cut]), "full.kv") == 70


def test_pool_series_places_before_turns_and_drained_and_splits_the_tree():
    full = next(g for g in pool_series(record()) if g.group == "full.kv")
    assert [(p.x, p.label) for p in full.points] == [
        (-1, "before"),
        (0, "0"),
        (1, "1"),
        (2, "2"),
        (3, "drained"),
    ]
    turn0 = full.points[1]  # its barrier probe: 6 session pages, 4 tree pages of which 3 evictable
    assert (
        turn0.stack["session"] == 6
        and turn0.stack["tree, pinned"] == 1
        and turn0.stack["tree, evictable"] == 3
    )
    assert [p.leaked for p in full.points] == [0, 0, 1, 3, 3]  # turn 1: the mid-turn probe's orphan
    assert [p.over_bound for p in full.points] == [0, 0, 2, 0, 0]
    assert full.capacity == 100 and full.held
    assert not next(g for g in pool_series(record()) if g.group == "swa.kv").held


def test_step_series_marks_barriers_and_probes_that_found_leaks():
    s = step_series(record())
    assert s.steps == (3, 5, 8, 9, 12)
    assert s.barriers == ((0, 5), (1, 9), (2, 12))
    assert s.flagged == (8, 12)
    assert list(s.used) == ["full.kv"]  # groups that never held a page are not drawn
    assert s.used["full.kv"][0] == 4.0  # % of 100 pages


def test_groups_that_held_nothing_get_one_line_not_a_panel(tmp_path):
    empty = RunRecord(
        turns=(Turn(turn=0, probes=(probe(1), probe(2))), Turn(turn=1, probes=(probe(4),))),
        baseline=probe(0),
        drained=probe(5),
    )
    series = {1: pool_series(record()), 2: pool_series(empty)}
    assert report_pool.held_groups(series) == ["full.kv"]  # held at c = 1 only: still a row

    run = RunResult(
        profile="abort-storm",
        concurrency=1,
        turns=2,
        requests=4,
        errors=0,
        verdicts={},
        record=empty,
    )
    summary = GateSummary(verdict="pass", faults=(), detectors={}, runs=(run,))
    page = write_report(summary, tmp_path).read_text()
    assert "nothing held in groups full.kv, swa.kv, swa.window, linear.state" in page
    assert "alt='pages per group at each barrier'" not in page


def test_latency_comes_from_the_gates_own_measurements_with_gaps_for_runs_without():
    from kvwatch.gate.verdicts.performance import Performance
    from kvwatch.harness.run_record import Timings

    streamed = Timings(ttft_ms=(10.0,) * 5, itl_ms=(2.0,) * 5, e2e_ms=(30.0,) * 5)
    whole = Timings(e2e_ms=(50.0, 50.0))
    series = latency_series({1: Performance.of(streamed), 2: Performance.of(whole), 4: None})
    assert list(series) == ["TTFT", "ITL", "end to end"]
    assert series["TTFT"][1] == pytest.approx((10.0, 10.0, 10.0))
    assert series["end to end"][2] == pytest.approx((50.0, 50.0, 50.0))
    assert all(math.isnan(v) for v in series["TTFT"][2])  # not streamed: a gap, not 0 ms
    assert all(math.isnan(v) for v in series["end to end"][4])
