"""OTel instrumentation as listeners: gauges, counters and spans from an in-process engine."""

from __future__ import annotations

import bisect
import itertools
import json

from conversations import small_cache
from fastapi.testclient import TestClient
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig
from kvwatch.engine.config import GROUP_NAMES, PrefixCacheMode
from kvwatch.gate.outputs.metrics import GateMetrics
from kvwatch.gate.outputs.summary import GateSummary
from kvwatch.instrumentation import Telemetry, buckets, instrument
from kvwatch.instrumentation import names as n
from kvwatch.serve import ServeOptions, build

LABELS = {n.OPERATION: "chat", n.MODEL: "tiny"}


def setup(config: EngineConfig | None = None):
    engine = Engine(config or EngineConfig(scheduler=SchedulerConfig(chunk_size=16)))
    reader, exporter = InMemoryMetricReader(), InMemorySpanExporter()
    telemetry = Telemetry(metric_readers=[reader], span_processors=[SimpleSpanProcessor(exporter)])
    instrument(engine.events, engine.stats, telemetry, stats_max_age=0)
    return engine, reader, exporter


def points(reader: InMemoryMetricReader, name: str) -> dict[frozenset, float]:
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    for p in metric.data.data_points:
                        value = getattr(p, "value", None)
                        out[frozenset(p.attributes.items())] = (
                            value if value is not None else p.count
                        )
    return out


def one(reader, name: str, **attrs) -> float:
    want = set(attrs.items())
    return sum(v for k, v in points(reader, name).items() if want <= set(k))


def run(engine: Engine, rid: str) -> None:
    while not engine.request_info(rid).done:
        engine.step()


def test_pool_gauges_follow_a_session_as_it_grows_and_closes():
    engine, reader, _ = setup()
    assert {dict(k)[n.GROUP] for k in points(reader, n.POOL_CAPACITY)} == set(GROUP_NAMES)
    sid = engine.open_session()
    held = []
    for turn in range(3):
        tokens = [*engine.session_tokens(sid), *range(65, 65 + 40 + turn)]
        rid = engine.add_request(tokens, SamplingParams(max_tokens=6), session_id=sid)
        run(engine, rid)
        engine.take(rid)
        held.append(one(reader, n.SESSION_PAGES, group="full.kv"))
        assert one(reader, n.POOL_PAGES, group="full.kv", state="pinned_session") == held[-1]
    assert held[0] < held[1] < held[2]
    assert one(reader, n.SESSIONS_LIVE) == 1
    engine.close_session(sid)
    for group in GROUP_NAMES:
        assert one(reader, n.SESSION_PAGES, group=group) == 0
    assert one(reader, n.SESSIONS_LIVE) == 0
    used = one(reader, n.POOL_PAGES, group="full.kv", state="used")
    assert (
        used == one(reader, n.POOL_PAGES, group="full.kv", state="evictable") > 0
    )  # now in the tree
    assert one(reader, n.ROOT_REFS) == one(reader, n.ROOT_REFS_EXPECTED) == 0


def test_counters_and_latency_histograms():
    engine, reader, _ = setup()
    prompt = list(range(70, 70 + 50))
    for _ in range(2):
        rid = engine.add_request(prompt, SamplingParams(max_tokens=5), labels=LABELS)
        run(engine, rid)
        engine.take(rid)
    assert one(reader, n.PREFIX_QUERIED) == 100
    assert one(reader, n.PREFIX_HIT) > 0  # the second request recovered the first one's state
    assert one(reader, n.TOKENS_GENERATED, **{n.MODEL: "tiny"}) == 10  # tallies keep labels
    assert 50 <= one(reader, n.PREFILL_COMPUTED) < 100  # the second prompt resumed
    assert one(reader, n.REQUESTS_FINISHED, reason="length") == 2
    assert one(reader, n.TTFT, **{n.MODEL: "tiny"}) == 2  # histogram counts
    assert one(reader, n.REQUEST_DURATION) == 2
    rid = engine.add_request([*prompt, 1, 2, 3], SamplingParams(max_tokens=5))
    engine.abort(rid)
    engine.take(rid)
    assert one(reader, n.ABORTS, stage="queued") == 1


def data_points(reader: InMemoryMetricReader, name: str) -> list:
    return [
        p
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
        for p in metric.data.data_points
    ]


def test_latency_ladders_are_in_seconds_and_roughly_geometric():
    for name, bounds in buckets.BOUNDS.items():
        assert bounds[0] <= 0.005 and bounds[-1] >= 10, name  # milliseconds to tens of seconds
        ratios = [b / a for a, b in itertools.pairwise(bounds)]
        assert all(1.3 <= r <= 3 for r in ratios), (name, ratios)
    assert buckets.TTFT_S[-1] >= 60 and buckets.REQUEST_DURATION_S[-1] >= 60
    assert buckets.TPOT_S[0] < buckets.TTFT_S[0]  # finer at the low end


def test_latency_histograms_aggregate_with_the_ladders_on_every_reader():
    engine, reader, _ = setup()
    rid = engine.add_request(list(range(70, 120)), SamplingParams(max_tokens=5), labels=LABELS)
    run(engine, rid)
    for name, bounds in buckets.BOUNDS.items():
        (point,) = data_points(reader, name)
        assert tuple(point.explicit_bounds) == bounds, name
        # the one latency recorded is counted in the bucket its value belongs to
        assert point.count == 1
        assert point.bucket_counts[bisect.bisect_left(bounds, point.sum)] == 1, name


def help_lines(page: str) -> dict[str, str]:
    """Series name -> the text of its ``# HELP`` line."""
    out = {}
    for line in page.splitlines():
        if line.startswith("# HELP "):
            name, _, text = line.removeprefix("# HELP ").partition(" ")
            out[name] = text
    return out


def test_metrics_page_has_help_text_for_every_series_and_the_ladders_as_buckets():
    app, _, telemetry = build(ServeOptions())
    with TestClient(app) as client:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        page = client.get("/metrics").text
    telemetry.shutdown()
    helps = help_lines(page)
    slots_only = (n.SLOTS_FILLED, n.SLOT_ENTRIES)  # the server runs the radix cache
    engine_names = [x for x in (*n.ENGINE_GAUGES, *n.COUNTERS, *n.SECONDS) if x not in slots_only]
    ours = {k: v for k, v in helps.items() if k.startswith(("kvwatch_", "gen_ai_"))}
    assert set(ours) == {n.prom(x) for x in engine_names}
    assert {x: ours[n.prom(x)] for x in engine_names} == {x: n.HELP[x] for x in engine_names}
    assert all(text.strip() for text in ours.values())
    families = {f.name: f for f in text_string_to_metric_families(page)}
    for name, bounds in buckets.BOUNDS.items():
        les = {s.labels["le"] for s in families[n.prom(name)].samples if s.name.endswith("_bucket")}
        assert les == {*(str(float(b)) for b in bounds), "+Inf"}, name


def test_gate_metrics_have_help_text():
    summary = GateSummary(verdict="pass", faults=(), detectors={}, runs=())
    metrics = GateMetrics(summary)
    try:
        helps = help_lines(metrics.text().decode())
    finally:
        metrics.close()
    gate = {k: v for k, v in helps.items() if k.startswith("kvwatch_gate_")}
    assert gate and all(text.strip() for text in gate.values()), gate
    assert gate[n.prom(n.GATE_VERDICT)] == n.HELP[n.GATE_VERDICT]


def test_request_span_has_queue_prefill_and_decode_children():
    engine, _, exporter = setup()
    sid = engine.open_session()
    rid = engine.add_request(
        list(range(65, 65 + 40)), SamplingParams(max_tokens=4), session_id=sid, labels=LABELS
    )
    run(engine, rid)
    spans = exporter.get_finished_spans()
    root = next(s for s in spans if s.parent is None)
    assert root.name == "chat tiny"
    children = [
        s.name for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id
    ]
    assert children[0] == n.SPAN_QUEUE
    assert children.count(n.SPAN_PREFILL) == 3  # 40 tokens in chunks of 16
    assert children[-1] == n.SPAN_DECODE
    attrs = root.attributes
    assert attrs[n.INPUT_TOKENS] == 40 and attrs[n.OUTPUT_TOKENS] == 4
    assert attrs[n.CONVERSATION] == sid and tuple(attrs[n.FINISH_REASONS]) == ("length",)
    assert attrs[n.CACHE_READ_TOKENS] == 0 and attrs[n.OPERATION] == "chat"


def test_slot_cache_operations_appear_as_span_events():
    config = EngineConfig(cache=small_cache(mode=PrefixCacheMode.SLOTS, slot_min_tokens=8))
    engine, reader, exporter = setup(config)
    convo = [256, 257, *range(65, 65 + 30), 262, 258, *range(97, 107), 262, 259]
    for _ in range(2):
        rid = engine.add_request(convo, SamplingParams(max_tokens=3))
        run(engine, rid)
        engine.take(rid)
    first, second = sorted(
        (s for s in exporter.get_finished_spans() if s.parent is None), key=lambda s: s.start_time
    )
    actions = lambda span: [e.attributes["action"] for e in span.events if e.name == n.EVENT_SLOT]  # noqa: E731
    assert actions(first) == ["SlotPrepared", "SlotConfirmed"]
    assert actions(second) == ["SlotRestored"]
    assert one(reader, n.SLOTS_FILLED) == 1 and one(reader, n.SLOT_ENTRIES) == 1


def test_served_spans_go_to_the_run_dir_without_prompt_text(tmp_path):
    for capture in (False, True):
        run_dir = tmp_path / str(capture)
        options = ServeOptions(run_dir=run_dir)
        options = ServeOptions(
            run_dir=run_dir, settings=options.settings.__class__(capture_content=capture)
        )
        app, _, telemetry = build(options)
        with TestClient(app) as client:
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": "secret words"}],
                "max_tokens": 2,
            }
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        telemetry.shutdown()
        spans = [json.loads(line) for line in (run_dir / "spans.jsonl").read_text().splitlines()]
        root = next(s for s in spans if s["parent_id"] is None)
        assert root["name"] == "chat tiny" and root["attributes"][n.INPUT_TOKENS] > 0
        assert ("secret words" in json.dumps(spans)) is capture
