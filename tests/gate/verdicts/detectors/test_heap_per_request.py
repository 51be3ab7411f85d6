"""The heap detector's per-request rule: what the judged turns leave behind once
the run has drained, closed its sessions and flushed.

The live test plants a leak no registry shows (a closure that keeps every
finished request's result) in a server's engine, records a run through the
same recorder and HTTP endpoints the gate uses, and checks that the rule names
the engine line that allocated what was kept; the same traffic without the
plant passes.
"""

from __future__ import annotations

import httpx
import pytest
from inprocserver import serving

from kvwatch.engine.engine import Engine
from kvwatch.gate.verdicts.detectors import heap
from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
from kvwatch.harness.run_record import Counts, HeapSample, RunRecord, SiteGrowth, Turn
from kvwatch.harness.sources import HttpSource
from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings


def _counts(n: int) -> Counts:
    return Counts(status={"2xx": n}, failed=0, broken_turns=0)


def _run(left: tuple[SiteGrowth, ...], at_mark: int, total: int) -> RunRecord:
    turns = tuple(
        Turn(
            turn=t,
            probes=(),
            conversations=1,
            context_tokens=0,
            heap=None,
            gauges=None,
            at=0.0,
            requests=_counts(at_mark * (t + 1) // 2),
        )
        for t in range(2)
    )
    turns += tuple(
        Turn(
            turn=t,
            probes=(),
            conversations=1,
            context_tokens=0,
            heap=None,
            gauges=None,
            at=0.0,
            requests=_counts(at_mark + t),
        )
        for t in range(2, 6)
    )
    return RunRecord(
        turns=turns,
        warmup=2,
        requests=_counts(total),
        heap_end=HeapSample(traced_bytes=0, top=(), by_site=None, since_mark=left),
    )


def test_a_site_that_keeps_an_allocation_per_request_fails():
    # 200 requests after the mark; 30 kB in 210 allocations at one site
    verdict = heap.detect(_run((SiteGrowth("server/x.py:10", 30_000, 210),), 40, 240))
    assert verdict.failed and verdict.first_turn == 6
    assert "server/x.py:10: 30000 bytes in 210 allocations" in verdict.evidence[0].detail
    assert "150 bytes per request (200 requests since turn 1)" in verdict.evidence[0].detail


@pytest.mark.parametrize(
    "growth",
    [
        SiteGrowth("a.py:1", 30_000, 3),  # a table that stays grown: few allocations
        SiteGrowth("a.py:2", 3_000, 210),  # a few bytes, under the floor
        SiteGrowth("a.py:3", 2_400, 150),  # 12 bytes per request
    ],
)
def test_one_off_and_small_growth_passes(growth):
    verdict = heap.detect(_run((growth,), 40, 240))
    assert verdict.verdict == "pass", verdict


def _record(plant: bool, monkeypatch) -> RunRecord:
    kept: list = []
    if plant:
        original = Engine.take

        def take(self, request_id):
            out = original(self, request_id)
            kept.append(out)  # never let go: no registry holds it, the heap does
            return out

        monkeypatch.setattr(Engine, "take", take)
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(enable_probe=True)))
    try:
        with serving(app) as url:
            source = HttpSource(url, white_box=True)
            recorder = TurnRecorder(source, RecorderOptions(warmup=2, heap=True))
            recorder.start()
            sent = 0
            with httpx.Client(base_url=url, timeout=120) as http:
                for turn in range(6):
                    for i in range(30):
                        resp = http.post(
                            "/v1/completions",
                            json={
                                "model": "kvwatch-tiny-hybrid",
                                "prompt": f"turn {turn} request {i}: tell me",
                                "max_tokens": 2,
                            },
                        )
                        assert resp.status_code == 200, resp.text
                        sent += 1
                    report = {"process": "p", "counts": _counts(sent).to_json(), "conversations": 1}
                    recorder.barrier(turn, [report])
            recorder.finish([report])
    finally:
        telemetry.shutdown()
    return recorder.record()


@pytest.mark.slow
@pytest.mark.parametrize("plant", [False, True])
def test_planted_per_request_leak_is_caught_by_its_site(plant, monkeypatch):
    run = _record(plant, monkeypatch)
    verdict = heap.request_rule(run)
    assert verdict is not None
    if not plant:
        assert verdict.verdict == "pass", verdict
        return
    assert verdict.failed, verdict
    assert any("engine/engine.py:" in e.detail for e in verdict.evidence), verdict.evidence
