"""Dashboards as code: the committed JSON, what each dashboard shows, and where
every series name comes from. (Prometheus runs the queries in
test_prometheus_panels.py; the push is in test_grafana_push.py.)"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.cli import main
from kvwatch.dashboards import build
from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig
from kvwatch.gate.outputs.annotate import annotations
from kvwatch.gate.outputs.metrics import GateMetrics
from kvwatch.gate.outputs.summary import GateSummary
from kvwatch.instrumentation import Telemetry, instrument
from kvwatch.instrumentation import names as n

SERIES = re.compile(r"\b((?:kvwatch|gen_ai)_[a-z_]+)")
MODELS = build.models()


def exprs(uid: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for title, target in build.targets(MODELS[uid]):
        out.setdefault(title, []).append(target["expr"])
    return out


def test_the_committed_json_is_what_the_builders_make(tmp_path):
    assert build.drift() == []
    assert main(["dashboards", "build", "--check"]) == 0
    copy = tmp_path / "json"
    shutil.copytree(build.COMMITTED, copy)
    edited = json.loads((copy / "kvwatch-pools.json").read_text())
    edited["title"] = "edited by hand"
    (copy / "kvwatch-pools.json").write_text(json.dumps(edited))
    assert build.drift(copy) == ["kvwatch-pools.json"]
    assert main(["dashboards", "build", "--check", "--out", str(copy)]) == 1
    assert main(["dashboards", "build", "--out", str(copy)]) == 0
    assert build.drift(copy) == []


def test_every_series_a_panel_reads_is_named_by_the_names_module():
    known = {n.prom(v) for k, v in vars(n).items() if k.isupper() and isinstance(v, str)}
    known |= {f"{n.prom(h)}_bucket" for h in n.SECONDS}
    for uid in MODELS:
        for title, queries in exprs(uid).items():
            for expr in queries:
                used = set(SERIES.findall(expr))
                assert used and used <= known, (uid, title, used - known)


def test_each_dashboard_has_a_templated_datasource_and_instance():
    for model in MODELS.values():
        variables = {v["name"]: v for v in model["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        assert variables["instance"]["query"].startswith("label_values(")
        for _, target in build.targets(model):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        tags = [a["target"]["tags"] for a in model["annotations"]["list"]]
        assert ["kvwatch-gate"] in tags


def test_the_pools_dashboard_shows_every_group_by_owner_against_capacity():
    pools = exprs("kvwatch-pools")
    assert MODELS["kvwatch-pools"]["title"] == "kvwatch / Prefix-cache pools"
    by_owner = pools["Pages by owner: $group"][0]
    for state in ("evictable", "pinned_request", "pinned_session", "host"):
        assert state in by_owner
    assert any(n.prom(n.POOL_CAPACITY) in e for e in pools["Used against capacity: $group"])
    assert 'family="state"' in pools["State pools by owner"][0]
    joined = json.dumps(pools)
    for name in (n.ROOT_REFS, n.ROOT_REFS_EXPECTED, n.TREE_SNAPSHOTS, n.SESSION_PAGES):
        assert n.prom(name) in joined
    repeated = [p for p in MODELS["kvwatch-pools"]["panels"] if p.get("repeat")]
    assert {p["repeat"] for p in repeated} == {"group"}


def test_the_serving_dashboard_has_latency_percentiles_and_load():
    serving = exprs("kvwatch-serving")
    for title in ("Time to first token", "Time per output token", "End-to-end request duration"):
        assert [e.split(",")[0] for e in serving[title]] == [
            "histogram_quantile(0.5",
            "histogram_quantile(0.9",
            "histogram_quantile(0.99",
        ]
    joined = json.dumps(serving)
    for name in (
        n.TOKENS_GENERATED,
        n.REQUESTS_LIVE,
        n.PREFIX_HIT,
        n.PREFIX_QUERIED,
        n.RETRACTIONS,
        n.ABORTS,
    ):
        assert n.prom(name) in joined, name


def test_the_leak_gate_dashboard_reads_the_verdict_and_the_heap_per_token():
    gate = json.dumps(exprs("kvwatch-leak-gate"))
    for name in (n.GATE_VERDICT, n.GATE_DETECTOR_FAILED, n.GATE_HEAP_PER_TOKEN):
        assert n.prom(name) in gate


def test_prom_names_match_what_the_exporter_writes():
    engine = Engine(EngineConfig(scheduler=SchedulerConfig(chunk_size=16)))
    telemetry = Telemetry(otlp=False)
    hooks = instrument(engine.events, engine.stats, telemetry, stats_max_age=0)
    rid = engine.add_request(list(range(40)), SamplingParams(max_tokens=4))
    while not engine.request_info(rid).done:
        engine.step()
    text = telemetry.render_metrics()[0].decode()
    hooks.close()
    seen = {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }
    slots_only = (n.SLOTS_FILLED, n.SLOT_ENTRIES)  # this engine runs the radix cache
    engine_names = [*n.ENGINE_GAUGES, *n.COUNTERS, *n.SECONDS]
    engine_names = [name for name in engine_names if name not in slots_only]
    for name in engine_names:
        expected = n.prom(name) + ("_bucket" if name in n.SECONDS else "")
        assert expected in seen, (name, expected)


SUMMARY_JSON = {
    "verdict": "fail",
    "faults": [],
    "detectors": {"heap": "fail", "allocator": "pass", "slot-table": "skipped"},
    "runs": [
        {
            "profile": "rl-rollout",
            "concurrency": 2,
            "turns": 5,
            "requests": 31,
            "errors": 1,
            "detectors": {
                "heap": {"verdict": "fail", "first_turn": 3, "evidence": "turn 3: +40 B/token"},
                "allocator": {"verdict": "pass", "first_turn": None, "evidence": ""},
                "slot-table": {"verdict": "skipped", "first_turn": None, "evidence": "no slots"},
            },
            "timeline": [{"turn": t, "at": 1_700_000_000.0 + 2 * t} for t in range(5)],
            "heap_bytes_per_context_token": [{"turn": 2, "value": 96.5}],
        },
        {
            "profile": "abort-storm",
            "concurrency": 1,
            "turns": 6,
            "requests": 0,
            "errors": 0,
            "detectors": {},
            "timeline": [],
            "error": "the load run ended without a record",
        },
    ],
}
SUMMARY = GateSummary.from_json(SUMMARY_JSON)


def test_gate_metrics_carry_the_verdicts_from_the_summary():
    metrics = GateMetrics(SUMMARY)
    try:
        text = metrics.text().decode()
    finally:
        metrics.close()
    samples = {
        (
            s.name,
            tuple(sorted((k, v) for k, v in s.labels.items() if not k.startswith("otel"))),
        ): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    run = (("concurrency", "2"), ("profile", "rl-rollout"))
    verdict = n.prom(n.GATE_VERDICT)
    assert samples[(verdict, (("verdict", "fail"),))] == 1
    assert samples[(verdict, (("verdict", "pass"),))] == 0
    failed = n.prom(n.GATE_DETECTOR_FAILED)
    assert samples[(failed, (run[0], ("detector", "heap"), run[1]))] == 1
    assert samples[(failed, (run[0], ("detector", "allocator"), run[1]))] == 0
    assert not any(k[0] == failed and ("detector", "slot-table") in k[1] for k in samples)
    first = n.prom(n.GATE_FIRST_FAIL_TURN)
    assert samples[(first, (run[0], ("detector", "heap"), run[1]))] == 3
    heap = n.prom(n.GATE_HEAP_PER_TOKEN)
    assert samples[(heap, (run[0], run[1], ("turn", "2")))] == 96.5
    broken = n.prom(n.GATE_RUN_BROKEN)
    assert samples[(broken, (("concurrency", "1"), ("profile", "abort-storm")))] == 1
    assert samples[(broken, run)] == 0


def test_annotations_put_each_finding_at_its_turn_and_a_region_per_run():
    found = list(annotations(SUMMARY))
    # the broken run recorded no barrier, so it has nothing to place
    assert len(found) == 2
    region, finding = found
    assert (region.time_ms, region.time_end_ms) == (1_700_000_000_000, 1_700_000_008_000)
    assert "fail" in region.tags and region.text == "rl-rollout c=2: fail (heap)"
    assert finding.time_ms == 1_700_000_006_000 and finding.time_end_ms is None
    assert {"kvwatch-gate", "heap", "leak", "rl-rollout", "c=2"} <= set(finding.tags)
    assert "turn 3" in finding.text and "+40 B/token" in finding.text


@pytest.mark.parametrize("flag", ["--pushgateway", "--grafana-url"])
def test_gate_rejects_a_publish_target_that_is_not_a_url(flag, capsys):
    assert main(["gate", "--profile", "bad-input", "-c", "1", flag, "not a url"]) == 2
    assert flag in capsys.readouterr().err
