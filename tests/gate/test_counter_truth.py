"""The counters' truth: over a run, each counter rises by what the engine's transitions say.

A real server in this process: requests that finish, one aborted by the test
controls while it decodes, one retracted and recovered. The counters on
``/metrics`` are read before and after, the lifecycle counter's transitions
from ``GET /debug/coverage``; ``gauge-trend`` judges the record. Clean it
passes; a listener that loses the aborts of one stage fails it.
"""

from __future__ import annotations

import httpx
from inprocserver import serving

from kvwatch.gate.detectors import counter_truth, gauge_trend
from kvwatch.harness.plan import PRESETS
from kvwatch.harness.run_record import RunRecord
from kvwatch.harness.sources import HttpSource
from kvwatch.instrumentation import metrics
from kvwatch.instrumentation.coverage import since
from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings
from kvwatch.targets.kvwatch_target import risen

MODEL = ServerSettings().model_name
COUNTERS = PRESETS["kvwatch"].counters


def _load(url: str) -> None:
    body = {"model": MODEL, "max_tokens": 6, "temperature": 0}
    controls = [None, {"abort_in": "decoding"}, {"retract_after": 8, "hold_steps": 2}, None]
    with httpx.Client(base_url=url, timeout=120) as http:
        for i, kvwatch in enumerate(controls):
            msg = [{"role": "user", "content": f"request {i} of a counted run " * 3}]
            sent = {**body, "messages": msg, **({"kvwatch": kvwatch} if kvwatch else {})}
            assert http.post("/v1/chat/completions", json=sent).status_code in (200, 400)


def record_a_run() -> RunRecord:
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(enable_probe=True)))
    try:
        with serving(app) as url:
            source = HttpSource(url, white_box=True, metrics_url=f"{url}/metrics")
            source.finished()  # nothing before the run counts
            before, counted = source.coverage(), source.gauges(COUNTERS)
            _load(url)
            coverage = since(before, source.coverage())
            counters = risen(counted, source.gauges(COUNTERS))
            done = source.finished()
    finally:
        telemetry.shutdown()
    return RunRecord(
        turns=(),
        coverage=coverage,
        counters=counters,
        finished=done["finished"],
        output_tokens=done["tokens"],
    )


def test_a_clean_servers_counters_rise_by_its_transitions():
    run = record_a_run()
    owed = counter_truth.owed(run.coverage["request"])
    assert owed[counter_truth.ABORTS] == 1 and owed[counter_truth.RETRACTIONS] >= 1  # not vacuous
    assert run.output_tokens > 0
    assert counter_truth.rises(run.counters)[counter_truth.TOKENS] == run.output_tokens
    assert counter_truth.untrue(run) == []


def test_a_listener_that_loses_the_aborts_of_one_stage_fails(monkeypatch):
    honest = metrics.EngineMetrics._aborted

    def lossy(self, e):
        if e.stage not in ("decode", "verify"):  # a decoding request's abort is lost
            honest(self, e)

    monkeypatch.setattr(metrics.EngineMetrics, "_aborted", lossy)
    run = record_a_run()
    details = [e.detail for e in counter_truth.untrue(run)]
    assert any(d.startswith("kvwatch_aborts_total rose 0") for d in details), details
    verdict = gauge_trend.detect(run._replace(flushed=None))
    assert verdict.verdict != "pass"  # no turns here: it says why, never passes


def test_a_listener_that_misses_the_first_token_of_each_request_fails(monkeypatch):
    honest = metrics.EngineMetrics._tokens

    def short(self, e):
        honest(self, e._replace(count=e.count - 1) if e.first else e)

    monkeypatch.setattr(metrics.EngineMetrics, "_tokens", short)
    details = [e.detail for e in counter_truth.untrue(record_a_run())]
    assert any(d.startswith("kvwatch_tokens_generated_total rose") for d in details), details


def test_no_readings_no_verdict():
    assert counter_truth.untrue(RunRecord(turns=())) == []
