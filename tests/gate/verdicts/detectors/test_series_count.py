"""The number of series on ``/metrics`` is judged like a gauge.

A server that labels a metric by request or session id makes new series
with every request and never drops them: no pool grows, but its metrics
page (and every Prometheus that scrapes it) does. ``gauge-trend`` reads the
count of series at every barrier (``scrape.SERIES``): it must not rise per
conversation over the judged turns, and after the drain it must be back at
its level at the end of the warm-up. The live test plants exactly that
label on kvwatch's own server and checks the gate sees it, and that the
same traffic without the plant passes.
"""

from __future__ import annotations

import httpx
from inprocserver import serving

from kvwatch.gate.verdicts.detectors import gauge_trend
from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
from kvwatch.harness.scrape import SERIES, read_series
from kvwatch.harness.sources import HttpSource
from kvwatch.instrumentation.metrics import EngineMetrics
from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings

PAGE = """# TYPE a counter
a_total{x="1"} 1
a_total{x="2"} 2
# TYPE b gauge
b 3
"""


def test_the_count_is_read_off_the_page():
    assert read_series(PAGE, (SERIES,)) == {SERIES: 3.0}
    assert read_series(PAGE, (SERIES, "b")) == {SERIES: 3.0, "b": 3.0}


def _verdict(monkeypatch, *, plant: bool):
    if plant:  # a metric labelled by request id: a series per request, never dropped
        original = EngineMetrics._attrs
        monkeypatch.setattr(
            EngineMetrics, "_attrs", lambda self, rid: {**original(self, rid), "request": rid}
        )
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(enable_probe=True)))
    try:
        with serving(app) as url, httpx.Client(base_url=url, timeout=120) as http:
            source = HttpSource(url, white_box=False, metrics_url=f"{url}/metrics")
            options = RecorderOptions(usage_gauges=(SERIES,), settled_gauges=(SERIES,))
            recorder = TurnRecorder(source, options)
            recorder.start()
            for turn in range(6):
                for agent in range(4):
                    messages = [{"role": "user", "content": f"turn {turn} of agent {agent}"}]
                    body = {"model": "t", "max_tokens": 3, "messages": messages}
                    assert http.post("/v1/chat/completions", json=body).status_code == 200
                recorder.barrier(turn, [{"conversations": 4}], drain=False)
            recorder.finish()
    finally:
        telemetry.shutdown()
    return gauge_trend.detect(recorder.record())


def test_a_series_per_request_fails_gauge_trend(monkeypatch):
    verdict = _verdict(monkeypatch, plant=True)
    assert verdict.failed, verdict
    assert SERIES in verdict.evidence[0].detail


def test_the_same_traffic_without_it_passes(monkeypatch):
    verdict = _verdict(monkeypatch, plant=False)
    assert verdict.verdict == "pass", verdict
