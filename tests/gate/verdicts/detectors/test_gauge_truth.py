"""The gauges' truth: each says what the probe counts; evictable is what a flush frees.

A real server in this process (``kvwatch serve``'s app, its OTel exporter on
``/metrics``), a recorder reading the pool gauges around every barrier probe
and on both sides of the drain's flush, and ``gauge-trend`` judging the
record: clean it passes; a gauge that reports sessions' pages as requests',
or an evictable figure that leaves out pages the flush then frees, fails it.
"""

from __future__ import annotations

import httpx
from inprocserver import serving

from kvwatch.engine.cache import reads
from kvwatch.engine.config import STATE_GROUPS
from kvwatch.gate.verdicts.detectors import gauge_trend, gauge_truth
from kvwatch.harness.plan import PRESETS
from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
from kvwatch.harness.run_record import RunRecord
from kvwatch.harness.sources import HttpSource
from kvwatch.instrumentation import metrics
from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings

MODEL = ServerSettings().model_name
TURNS = 3


def _turns(url: str, recorder: TurnRecorder) -> None:
    """Two sessions, a turn each per barrier, closed before the drain."""
    with httpx.Client(base_url=url, timeout=120) as http:
        sids = [http.post("/v1/sessions", json={}).json()["id"] for _ in range(2)]
        for turn in range(TURNS):
            for i, sid in enumerate(sids):
                body = {"model": MODEL, "max_tokens": 3, "session_id": sid}
                body["messages"] = [{"role": "user", "content": f"turn {turn} of agent {i} " * 4}]
                assert http.post("/v1/chat/completions", json=body).status_code == 200
            recorder.barrier(turn, [{"conversations": 2}])
        for sid in sids:
            assert http.delete(f"/v1/sessions/{sid}").status_code == 200


def record_a_run() -> RunRecord:
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(enable_probe=True)))
    try:
        with serving(app) as url:
            source = HttpSource(url, white_box=True, metrics_url=f"{url}/metrics")
            options = RecorderOptions(warmup=1, truth_gauges=PRESETS["kvwatch"].truth)
            recorder = TurnRecorder(source, options)
            recorder.start()
            _turns(url, recorder)
            recorder.finish()
    finally:
        telemetry.shutdown()
    return recorder.record()


def test_a_clean_server_s_gauges_say_what_its_probes_count():
    run = record_a_run()
    assert all(t.pool_gauges for t in run.turns) and run.flushed is not None  # not vacuous
    assert gauge_truth.read(run) == TURNS + 2
    assert run.flushed.before.groups["full.kv"].evictable > 0  # the flush had work to do
    assert gauge_truth.untrue_at_barriers(run) is None
    assert gauge_truth.untrue_at_flush(run) == []
    verdict = gauge_trend.detect(run)
    assert verdict.verdict == "pass", verdict


def test_a_gauge_that_files_sessions_pages_as_requests_fails_at_the_first_barrier(monkeypatch):
    honest = metrics._pool_pages

    def swapped(stats):
        for obs in honest(stats):
            state = obs.attributes[metrics.n.STATE]
            if state in ("pinned_request", "pinned_session"):
                other = "pinned_session" if state == "pinned_request" else "pinned_request"
                group = stats.groups[obs.attributes[metrics.n.GROUP]]
                wrong = group.by_owner.get("request" if other == "pinned_request" else "session")
                yield metrics.Observation(wrong, obs.attributes)
            else:
                yield obs

    monkeypatch.setattr(metrics, "_pool_pages", swapped)
    verdict = gauge_trend.detect(record_a_run())
    assert verdict.failed and verdict.first_turn == 0, verdict
    details = " ".join(e.detail for e in verdict.evidence)
    assert 'state="pinned_session"} at turn 0' in details and "the probe counts" in details


def test_an_evictable_figure_that_leaves_out_snapshots_fails_against_the_flush(monkeypatch):
    """The engine's own count lies here, so the probe agrees with the gauge: only
    what the flush then frees shows it."""
    honest = reads.group_usage

    def without_snapshots(view):
        usage = honest(view)
        return {g: u._replace(evictable=0) if g in STATE_GROUPS else u for g, u in usage.items()}

    monkeypatch.setattr(reads, "group_usage", without_snapshots)
    run = record_a_run()
    assert gauge_truth.untrue_at_barriers(run) is None  # gauge and probe tell the same lie
    verdict = gauge_trend.detect(run)
    assert verdict.failed and verdict.after_drain, verdict
    assert any(
        "state=evictable} said 0 pages before the flush, and the flush freed" in e.detail
        for e in verdict.evidence
    ), verdict.evidence


def test_a_pool_gauge_that_is_no_longer_exported_fails(monkeypatch):
    monkeypatch.setattr(metrics, "_pool_pages", lambda stats: iter(()))
    verdict = gauge_trend.detect(record_a_run())
    assert verdict.failed and verdict.first_turn == 0, verdict
    assert 'state="free"} at turn 0: no series' in verdict.evidence[0].detail


def test_a_tree_gauge_that_lags_the_tree_fails(monkeypatch):
    """Any engine gauge, not only the pools: a snapshot count read off a stale copy."""
    honest = metrics.EngineMetrics._gauges

    def stale_nodes(self, meter):
        honest(self, meter)
        stats = self.stats.get

        def lagging():
            s = stats()
            return s._replace(tree=s.tree._replace(nodes=max(0, s.tree.nodes - 1)))

        self.stats.get = lagging

    monkeypatch.setattr(metrics.EngineMetrics, "_gauges", stale_nodes)
    verdict = gauge_trend.detect(record_a_run())
    assert verdict.failed, verdict
    assert any("kvwatch_tree_nodes" in e.detail for e in verdict.evidence), verdict.evidence
