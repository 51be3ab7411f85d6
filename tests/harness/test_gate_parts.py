"""The gate's parts without a load run: profiles, run plans, engine overrides,
series scraping, forced retraction and the CLI's usage errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvwatch.engine import EngineConfig, SamplingParams
from kvwatch.engine.config import PrefixCacheMode
from kvwatch.engine.overrides import apply_overrides
from kvwatch.gate.verdicts.detectors.requests import failure_line
from kvwatch.harness.plan import PRESETS, RunPlan, preset
from kvwatch.harness.profiles import PROFILES
from kvwatch.harness.run_record import Counts, merge_counts
from kvwatch.harness.scrape import parse_spec, read_series
from kvwatch.loadtests.statuses import StatusCounts

DESIGN_PROFILES = (
    "agentic-trie",
    "streaming-session",
    "abort-storm",
    "rl-rollout",
    "slot-cache",
    "chaos",
    "edges",
    "bad-input",
)


def kvwatch(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kvwatch", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_profiles_json_lists_the_eight_profiles_with_valid_engine_configs():
    out = kvwatch("profiles", "--json")
    assert out.returncode == 0, out.stderr
    entries = json.loads(out.stdout)
    assert tuple(e["name"] for e in entries) == DESIGN_PROFILES
    for entry in entries:
        config = apply_overrides(EngineConfig(), entry["engine"])  # raises if invalid
        assert config.cache.full_kv.capacity <= 1024  # small pools: pressure within a run
    slot = apply_overrides(EngineConfig(), PROFILES["slot-cache"].engine_config())
    assert slot.cache.mode is PrefixCacheMode.SLOTS


def test_overrides_reject_unknown_fields_and_bad_values():
    c = apply_overrides(EngineConfig(), {"scheduler": {"spec": {"num_drafts": 3}}})
    assert c.scheduler.spec.num_drafts == 3  # a None field typed as a dataclass is built
    for bad, message in [
        ({"cache": {"pages": 1}}, "unknown config field 'cache.pages'"),
        ({"scheduler": {"chunk_size": "big"}}, "must be an integer"),
        ({"scheduler": {"chunk_size": 0}}, "chunk_size must be >= 1"),
        ({"cache": {"full_kv": {"capacity": True}}}, "must be int"),
        ({"cache": 3}, "config 'cache' must be an object"),
    ]:
        with pytest.raises(ValueError, match=message):
            apply_overrides(EngineConfig(), bad)


@pytest.mark.e2e
def test_serve_rejects_a_bad_config_file_with_exit_2(tmp_path):
    bad = tmp_path / "engine.json"
    bad.write_text('{"cache": {"full_kv": {"capacity": -4}}}')
    out = kvwatch("serve", "--config", str(bad))
    assert out.returncode == 2 and "capacity" in out.stderr
    bad.write_text("{not json")
    out = kvwatch("serve", "--config", str(bad))
    assert out.returncode == 2 and "not valid JSON" in out.stderr


def test_retract_every_pushes_requests_out_and_outputs_stay_exact():
    from kvwatch.engine import Engine
    from kvwatch.engine.events import RequestRetracted

    base = {"scheduler": {"chunk_size": 16, "max_batch_tokens": 32}}
    forced = apply_overrides(
        EngineConfig(), {**base, "scheduler": {**base["scheduler"], "retract_every": 3}}
    )
    off = apply_overrides(EngineConfig(), {**base, "cache": {"mode": "off"}})
    prompts = [[256, *range(40 + i, 120 + i)] for i in range(4)]
    params = SamplingParams(max_tokens=12)
    engine = Engine(forced)
    retracted = []
    engine.events.subscribe(RequestRetracted, retracted.append)
    got = [o.token_ids for o in engine.generate(prompts, params)]
    want = [o.token_ids for o in Engine(off).generate(prompts, params)]
    assert retracted, "retract_every never retracted"
    assert got == want
    with pytest.raises(ValueError, match="retract_every"):
        apply_overrides(EngineConfig(), {"scheduler": {"retract_every": -1}})


def test_run_plan_round_trips_through_json(tmp_path):
    plan = RunPlan(
        profile="slot-cache",
        concurrency=4,
        target="http://x",
        record=str(tmp_path / "r.json"),
        gauges=preset("sglang"),
    )
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert RunPlan.load(path) == plan


PAGE = """# HELP kvwatch_pool_pages x
# TYPE kvwatch_pool_pages gauge
kvwatch_pool_pages{family="state",group="linear.state",otel_scope_name="kvwatch",state="used"} 7.0
kvwatch_pool_pages{family="state",group="linear.state",otel_scope_name="kvwatch",state="free"} 9.0
kvwatch_pool_pages{family="history",group="full.kv",otel_scope_name="kvwatch",state="used"} 40.0
# HELP vllm:kv_cache_usage_perc x
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
"""


def test_read_series_selects_by_labels_and_keeps_the_rest_apart():
    got = read_series(PAGE, ('kvwatch_pool_pages{state="used"}', "vllm:kv_cache_usage_perc"))
    assert got == {
        'kvwatch_pool_pages{family="state",group="linear.state",state="used"}': 7.0,
        'kvwatch_pool_pages{family="history",group="full.kv",state="used"}': 40.0,
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"}': 0.25,
    }
    assert read_series(PAGE, ("sglang:token_usage",)) == {}
    with pytest.raises(ValueError, match="bad series"):
        parse_spec("no spaces allowed{")
    assert set(PRESETS) == {"kvwatch", "vllm", "sglang"}
    assert "sglang:mamba_usage" in PRESETS["sglang"].usage
    with pytest.raises(ValueError, match="unknown gauge preset"):
        preset("tgi")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--profile", "nope"], "unknown profile"),
        (["--turns", "3"], "--turns must be at least 6"),
        (["--inject", "no-such-fault"], "unknown fault"),
        (["--target", "http://127.0.0.1:9"], "--target and --metrics-url go together"),
        (
            [
                "--target",
                "http://x",
                "--metrics-url",
                "http://x/m",
                "--inject",
                "root-in-evict-set",
            ],
            "cannot reach a --target",
        ),
        (["-c", "0"], "concurrencies in 1..64"),
        (["--gauges", "tgi"], "unknown gauge preset"),
    ],
)
def test_gate_usage_errors_exit_2(args, message, tmp_path):
    out = kvwatch("gate", "--out", str(tmp_path), *args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr


def test_sessions_pushed_out_mid_step_keep_within_the_audit_bounds():
    """A session retracted after its step's pages were placed parks with that
    tail (freed when it resumes): legitimate, so no bound may flag it."""
    from kvwatch.engine import Engine

    cfg = apply_overrides(
        EngineConfig(),
        {
            "scheduler": {
                "chunk_size": 48,
                "max_batch_tokens": 128,
                "retract_every": 2,
                "spec": {"num_drafts": 4},
            }
        },
    )
    engine = Engine(cfg)
    sessions = [engine.open_session() for _ in range(2)]
    parked_with_tail = 0
    for turn in range(4):
        for i, sid in enumerate(sessions):
            history = engine.session_tokens(sid)
            new = [257, *(range(40, 200) if turn == 0 else range(60 + i, 90 + i)), 262, 260]
            engine.add_request([*history, *new], SamplingParams(max_tokens=10), session_id=sid)
        while engine.has_unfinished():
            engine.step()
            report = engine.probe()
            assert report.clean, report.findings
            assert not [b for b in report.bounds.values() if b.exceeded], report.bounds
            slots = [engine._sessions.get(sid).holder for sid in sessions]  # parked: theirs
            parked_with_tail += sum(
                h is not None and h.status.name == "PARKED" and h.allocated_len > h.computed_len
                for h in slots
            )
    assert parked_with_tail, "no session was ever pushed out mid-step"


def test_a_request_whose_admission_raises_fails_alone(monkeypatch):
    """A cache broken past repair (as an injected fault can leave it) fails the one
    request it breaks; the loop does not retry the same broken step forever."""
    from kvwatch.engine import Engine

    engine = Engine(EngineConfig())
    real_match = engine._cache.match
    broken = engine.add_request([256, *range(40, 90)], SamplingParams(max_tokens=4))

    def match(holder):
        if engine._requests[broken].holder is holder:
            raise ValueError("holder state is corrupt")
        return real_match(holder)

    monkeypatch.setattr(engine._cache, "match", match)
    fine = engine.add_request([256, *range(50, 100)], SamplingParams(max_tokens=4))
    for _ in range(50):
        if not engine.has_unfinished():
            break
        engine.step()
    assert not engine.has_unfinished()
    assert "internal error while admitting" in engine.take(broken).error
    assert engine.take(fine).error is None


def test_request_counts_come_from_request_events_and_merge_by_process():
    """Each process counts its users' answers; at the END barrier every user hands
    in its process's counts so far, and the last (largest) report of each wins."""

    class Answer:
        def __init__(self, code: int) -> None:
            self.status_code, self.text = code, "oops" if code >= 500 else ""

    worker = StatusCounts()
    worker.on_request("POST", "chat", response=Answer(200))
    worker.on_request("TTFT", "chat")  # a latency sample, not a request
    early = worker.counts()
    worker.on_request("POST", "chat", response=Answer(400), exception=RuntimeError("400"))
    worker.on_request("POST", "chat", response=Answer(503), exception=RuntimeError("503"))
    worker.on_request("TURN", "AgentTrieUser", exception=KeyError("choices"))
    worker.on_request("POST", "chat", response=None, exception=ConnectionError("refused"))
    late = worker.counts()
    assert late.status == {"2xx": 1, "4xx": 1, "5xx": 1, "none": 1}
    assert (late.requests, late.errors, late.broken_turns) == (5, 4, 1)
    # every failed request is kept as evidence, with what went wrong, not only 5xx
    kept = [(f["status"], f["error"]) for f in late.first_failures]
    assert kept == [
        (400, "RuntimeError: 400"),
        (503, "RuntimeError: 503"),
        (0, "ConnectionError: refused"),
    ]
    assert failure_line(late.first_failures[2]) == "chat: no answer (ConnectionError: refused)"
    assert failure_line(late.first_failures[1]) == "chat: HTTP 503 (RuntimeError: 503) oops"
    other = Counts(status={"2xx": 7}, failed=0, broken_turns=0)
    reports = [
        ("w1", early),
        ("w2", other),
        ("w1", late),
        ("w2", Counts(status={"2xx": 3}, failed=0, broken_turns=0)),
    ]
    total = merge_counts(reports)
    assert total.status == {"2xx": 8, "4xx": 1, "5xx": 1, "none": 1}
    assert (total.requests, total.errors) == (12, 4)
    assert Counts.from_json(total.to_json()) == total  # the record's JSON round trip


def test_max_replays_spreads_over_the_run_and_keeps_both_ends():
    from kvwatch.targets.kvwatch.replay import spread

    items = list(range(10))
    assert spread(items, None) == items and spread(items, 20) == items
    assert spread(items, 4) == [0, 3, 6, 9]
    assert spread(items, 1) == [9]
