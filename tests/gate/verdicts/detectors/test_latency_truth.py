"""Latency truth: no server histogram counts a request slower than its client measured it.

A real server in this process answers streamed chats whose first token,
duration and output tokens the test's own client measures; the histograms'
buckets are read from ``/metrics`` before and after, and ``gauge-trend``'s
latency check judges the record. Clean it passes; a listener that records the first token
in milliseconds, or a request's whole decode as its time per output token,
fails it. The bound holds however busy the machine: a late client only
measures more.
"""

from __future__ import annotations

import json
import time

import httpx
from inprocserver import serving

from kvwatch.gate.verdicts.detectors import latency_truth
from kvwatch.harness.plan import PRESETS
from kvwatch.harness.run_record import RunRecord, Timings
from kvwatch.harness.sources import HttpSource
from kvwatch.instrumentation import metrics
from kvwatch.instrumentation import names as n
from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings
from kvwatch.targets.kvwatch.target import risen

MODEL = ServerSettings().model_name
COUNTERS = PRESETS["kvwatch"].counters


def _stream(http: httpx.Client, i: int) -> tuple[float | None, float, int, str]:
    """(ms to the first content chunk, None if no chunk held text; ms to the end,
    output tokens, finish reason)."""
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"request {i} of a timed run " * 4}],
    }
    start, first, reason, usage = time.perf_counter(), None, "", {}
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage.update(chunk.get("usage") or {})
            if chunk["choices"]:
                reason = chunk["choices"][0].get("finish_reason") or reason
                if chunk["choices"][0]["delta"].get("content") and first is None:
                    first = time.perf_counter()
    end = time.perf_counter()
    ttft = None if first is None else (first - start) * 1000
    return ttft, (end - start) * 1000, usage["completion_tokens"], reason


def record_a_run(requests: int = 6) -> RunRecord:
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(enable_probe=True)))
    try:
        with serving(app) as url, httpx.Client(base_url=url, timeout=120) as http:
            source = HttpSource(url, white_box=True, metrics_url=f"{url}/metrics")
            before = source.gauges(COUNTERS)
            timed = [_stream(http, i) for i in range(requests)]
            counters = risen(before, source.gauges(COUNTERS))
    finally:
        telemetry.shutdown()
    timings = Timings(
        ttft_ms=tuple(t for t, _, _, _ in timed if t is not None),
        e2e_ms=tuple(e for _, e, _, _ in timed),
        finished=tuple((e, k) for _, e, k, r in timed if r in ("stop", "length")),
    )
    return RunRecord(turns=(), counters=counters, timings=timings)


def test_a_clean_servers_histograms_stay_within_its_clients_measurements():
    run = record_a_run()
    # not vacuous: every request finished and was timed, and most streamed text
    assert len(run.timings.finished) == 6 and len(run.timings.ttft_ms) >= 3
    for histogram in latency_truth.HISTOGRAMS:
        rises = latency_truth.bucket_rises(run.counters, histogram)
        assert rises[float("inf")] >= 6, (histogram, rises)
    assert latency_truth.untrue(run) == []


def test_a_first_token_recorded_in_milliseconds_fails(monkeypatch):
    honest = metrics.EngineMetrics._tokens

    def in_ms(self, e):
        record = self.ttft.record
        self.ttft.record = lambda value, attrs=None: record(value * 1000, attrs)
        try:
            honest(self, e)
        finally:
            self.ttft.record = record

    monkeypatch.setattr(metrics.EngineMetrics, "_tokens", in_ms)
    run = record_a_run()
    (ev,) = latency_truth.untrue(run)
    assert ev.detail.startswith(n.prom(n.TTFT) + "_bucket"), ev.detail


def test_a_whole_decode_recorded_as_the_time_per_token_fails(monkeypatch):
    honest = metrics.EngineMetrics._finished

    def undivided(self, e):
        # the mean over the later tokens forgotten: the whole decode is recorded
        honest(self, e._replace(output_tokens=min(e.output_tokens, 2)))

    monkeypatch.setattr(metrics.EngineMetrics, "_finished", undivided)
    run = record_a_run()
    details = [e.detail for e in latency_truth.untrue(run)]
    assert any(d.startswith(n.prom(n.TPOT) + "_bucket") for d in details), details


def test_the_bound_is_per_bucket_and_ignores_what_only_the_server_timed():
    name = n.prom(n.TTFT) + "_bucket"
    counters = {
        f'{name}{{le="0.05"}}': 3.0,
        f'{name}{{le="0.1"}}': 5.0,
        f'{name}{{le="+Inf"}}': 7.0,
    }
    # the server timed 7, the clients 4 (two left early, one failed): the server's are earlier
    run = RunRecord(turns=(), counters=counters, timings=Timings(ttft_ms=(40, 45, 60, 95)))
    assert latency_truth.untrue(run) == []
    # four client figures at or below 50 ms; the server counted only three there
    late = run._replace(timings=Timings(ttft_ms=(40, 45, 48, 50)))
    (ev,) = latency_truth.untrue(late)
    assert "le=0.05" in ev.detail and "measured 4" in ev.detail
