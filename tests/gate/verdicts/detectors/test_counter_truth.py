"""The counters' truth: over a run, each counter rises by what the engine's transitions say.

A real server in this process: requests that finish, one aborted by the test
controls while it decodes, one retracted and recovered. The counters on
``/metrics`` are read before and after, the lifecycle counter's transitions
from ``GET /debug/coverage``; ``gauge-trend`` judges the record. Clean it
passes; a listener that loses the aborts of one stage fails it.

The token and eviction counters get a run of their own: long prompts in
small chunks that share a prefix, cut mid-prefill (aborted, retracted),
retracted while decoding and paused, then a flush (nodes, snapshots and, on
the slot backend, slots evicted). Clean, the prefill identity holds and each
kind of eviction rises by the ledger's count; a listener or an event payload
that lies about one of them fails it.
"""

from __future__ import annotations

import httpx
from inprocserver import serving
from serverproc import wait_idle

from kvwatch.engine import events, scheduler
from kvwatch.gate.verdicts.detectors import counter_truth, gauge_trend
from kvwatch.harness.plan import PRESETS
from kvwatch.harness.run_record import RunRecord
from kvwatch.harness.sources import HttpSource
from kvwatch.instrumentation import metrics
from kvwatch.instrumentation.coverage import since
from kvwatch.instrumentation.prefill_ledger import PREFILL
from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings
from kvwatch.targets.kvwatch.target import risen

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


SHARED = "a system prompt that every request of the token run begins with, " * 4
TOKEN_RUN = [  # (test controls, what follows the shared prefix)
    (None, "the first request"),
    (None, "the second request, which finds the first's prefix"),
    ({"abort_in": "prefilling"}, "aborted while it computes its prompt " * 6),
    ({"retract_after": 8, "hold_steps": 2}, "retracted while it computes its prompt " * 6),
    ({"retract_after": 40, "hold_steps": 2}, "retracted once it decodes"),
    ({"pause_after_output": 2, "hold_steps": 2}, "paused while it decodes"),
    ({"abort_in": "decoding"}, "aborted while it decodes"),
]
SLOTS = {"cache": {"mode": "slots", "slots": 2}, "scheduler": {"chunk_size": 32}}


def _token_load(url: str) -> None:
    body = {"model": MODEL, "max_tokens": 6, "temperature": 0}
    with httpx.Client(base_url=url, timeout=120) as http:
        for kvwatch, tail in TOKEN_RUN:
            msg = [  # a second turn: the slot backend snapshots at its start
                {"role": "user", "content": SHARED},
                {"role": "assistant", "content": "noted"},
                {"role": "user", "content": tail},
            ]
            sent = {**body, "messages": msg, **({"kvwatch": kvwatch} if kvwatch else {})}
            assert http.post("/v1/chat/completions", json=sent).status_code in (200, 400)
        # the last request's abort is answered before the engine's next step lets it
        # go; a flush before then is refused (409 engine_busy), as the server promises
        assert wait_idle(url)["live_requests"] == 0
        assert http.post("/debug/flush_cache").status_code == 200


def record_a_run(load=_load, overrides=None) -> RunRecord:
    options = ServeOptions(settings=ServerSettings(enable_probe=True), overrides=overrides or {})
    app, _, telemetry = build(options)
    try:
        with serving(app) as url:
            source = HttpSource(url, white_box=True, metrics_url=f"{url}/metrics")
            source.finished()  # nothing before the run counts
            before, counted = source.coverage(), source.gauges(COUNTERS)
            load(url)
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


def token_run(overrides=None) -> RunRecord:
    return record_a_run(_token_load, overrides or {"scheduler": {"chunk_size": 32}})


def test_a_clean_servers_token_and_eviction_counters_tell_the_truth():
    run = token_run()
    ledger, got = run.coverage[PREFILL], counter_truth.rises(run.counters)
    # not vacuous: covered requests that hit, cut first admissions, recoveries, a flush
    assert ledger["covered"] >= 4 and got[counter_truth.HIT] > 0, (ledger, got)
    assert ledger["uncovered queried"] > 0 and ledger["recomputed"] > 0, ledger
    assert run.coverage["request"]["decoding -> retracted"] == 1  # recomputes past its prefill
    owed = counter_truth.evictions_owed(run.coverage)
    assert owed["evictions:node"] > 0 and owed["evictions:snapshot"] > 0, owed
    assert counter_truth.untrue(run) == []


def test_a_clean_slot_servers_slot_evictions_are_counted():
    run = token_run(SLOTS)
    assert counter_truth.evictions_owed(run.coverage)["evictions:slot"] > 0, run.coverage["slot"]
    assert counter_truth.untrue(run) == []


def test_cached_tokens_that_take_in_the_partial_page_fail(monkeypatch):
    """The engine says a request skipped every token it shares, to the token, though
    it resumes at a page-aligned snapshot and computes the partial page again."""

    def scheduled(**kw):
        return events.RequestScheduled(**{**kw, "cached_tokens": kw["branch_tokens"]})

    monkeypatch.setattr(scheduler, "RequestScheduled", scheduled)
    details = [e.detail for e in counter_truth.untrue(token_run())]
    assert any(counter_truth.HIT in d for d in details), details


def test_a_listener_that_counts_the_history_hit_as_cached_fails(monkeypatch):
    def scheduled(self, e):
        req = self._requests.get(e.request_id)
        if req is not None:
            self.queried.add(req.prompt, req.key)
            self.hit.add(e.hit_tokens, req.key)  # the tree's history, not what was skipped

    monkeypatch.setattr(metrics.EngineMetrics, "_scheduled", scheduled)
    details = [e.detail for e in counter_truth.untrue(token_run())]
    assert any(counter_truth.QUERIED in d for d in details), details


def test_a_listener_that_counts_a_chunks_end_fails(monkeypatch):
    def chunk_end(self, e):
        self.computed.add(e.start + e.tokens)  # where the chunk ends, not its size

    monkeypatch.setattr(metrics.EngineMetrics, "_prefill_chunk", chunk_end)
    details = [e.detail for e in counter_truth.untrue(token_run())]
    assert any(counter_truth.COMPUTED in d for d in details), details


def test_a_chunk_sent_twice_fails(monkeypatch):
    honest = scheduler.Scheduler._apply

    def twice(self, work, res):
        out = honest(self, work, res)
        if work.start == 0 and work.n > 1:  # a prompt's first chunk is announced again
            chunk = events.PrefillChunk(
                request_id=work.request.id, start=0, tokens=work.n, step=self.step
            )
            self.events.emit(chunk)
        return out

    monkeypatch.setattr(scheduler.Scheduler, "_apply", twice)
    details = [e.detail for e in counter_truth.untrue(token_run())]
    assert any(counter_truth.COMPUTED in d for d in details), details


def test_a_listener_that_counts_flushed_snapshots_as_nodes_fails(monkeypatch):
    def mislabelled(self, e):
        if e.reason in ("pruned", "evicted"):
            self.evictions.add(1, {"kind": "snapshot"})
        elif e.reason == "flushed":
            self.evictions.add(1, {"kind": "node"})

    monkeypatch.setattr(metrics.EngineMetrics, "_snapshot_released", mislabelled)
    details = [e.detail for e in counter_truth.untrue(token_run())]
    assert any(d.startswith("evictions:snapshot rose") for d in details), details
    assert any(d.startswith("evictions:node rose") for d in details), details


def test_a_listener_that_does_not_count_slot_evictions_fails(monkeypatch):
    monkeypatch.setattr(metrics.EngineMetrics, "_slot_evicted", lambda self, e: None)
    details = [e.detail for e in counter_truth.untrue(token_run(SLOTS))]
    assert any(d.startswith("evictions:slot rose 0") for d in details), details


def test_no_readings_no_verdict():
    assert counter_truth.untrue(RunRecord(turns=())) == []
