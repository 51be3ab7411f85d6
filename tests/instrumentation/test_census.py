"""The heap by census: live instances of kvwatch's classes, counted at the warm-up's
end and once the run drained, at any concurrency.

The live tests plant a reference no attribute walk can reach (a closure that
keeps every request the engine hands out) and check the heap detector names
the class it keeps, and that the same traffic without the plant passes.
"""

from __future__ import annotations

import httpx
from inprocserver import serving

from kvwatch.engine.engine import Engine
from kvwatch.gate.verdicts.detectors import heap
from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
from kvwatch.harness.run_record import Counts
from kvwatch.harness.sources import HttpSource
from kvwatch.instrumentation.census import census
from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings

REQUEST = "kvwatch.engine.request.Request"


class _Thing:
    pass


_Thing.__module__ = "kvwatch.engine.fake"  # a class of a test module is not kvwatch's: pretend


def test_the_census_counts_live_instances_of_kvwatch_classes():
    before = census().get("kvwatch.engine.fake._Thing", 0)
    kept = [_Thing() for _ in range(5)]
    assert census()["kvwatch.engine.fake._Thing"] == before + 5
    del kept
    assert census().get("kvwatch.engine.fake._Thing", 0) == before


def _counts(sent: int) -> dict:
    return {
        "process": "p",
        "counts": Counts(status={"2xx": sent}, failed=0, broken_turns=0).to_json(),
    }


def _run(monkeypatch, *, plant: bool):
    if plant:  # every request handed out stays referenced from a closure
        original, hidden = Engine.take, []

        def take(self, request_id):
            hidden.append(self._requests[request_id])
            return original(self, request_id)

        monkeypatch.setattr(Engine, "take", take)
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(enable_probe=True)))
    try:
        with serving(app) as url, httpx.Client(base_url=url, timeout=120) as http:
            recorder = TurnRecorder(HttpSource(url, white_box=True), RecorderOptions(census=True))
            recorder.start()
            sent = 0
            for turn in range(5):
                for i in range(6):
                    body = {"model": "t", "max_tokens": 2, "prompt": f"turn {turn}, request {i}"}
                    assert http.post("/v1/completions", json=body).status_code == 200
                    sent += 1
                recorder.barrier(turn, [{"conversations": 6, **_counts(sent)}])
            recorder.finish([_counts(sent)])
    finally:
        telemetry.shutdown()
    return recorder.record()


def test_requests_kept_after_the_run_fail_the_heap_by_census(monkeypatch):
    record = _run(monkeypatch, plant=True)
    assert record.census_mark is not None and record.census_end is not None
    verdict = heap.detect(record)
    assert verdict.failed and verdict.after_drain, verdict
    details = [e.detail for e in verdict.evidence]
    assert any(d.startswith(f"{REQUEST}: 18 more live instances") for d in details), details


def test_the_same_traffic_without_the_plant_passes(monkeypatch):
    record = _run(monkeypatch, plant=False)
    verdict = heap.detect(record)
    assert verdict.verdict == "pass", verdict
    assert "census back at its level" in verdict.note
