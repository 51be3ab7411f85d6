"""Failpoints and engine settings in the gate: the embedded engine runs with
failpoints on, seeded by the gate's seed; a failed site is counted as
coverage; a request a failpoint failed is an answer the load expects (and
nothing else is); ``--engine-set`` changes every profile's engine, and a bad
one is a usage error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from kvwatch.engine import Engine, EngineConfig
from kvwatch.engine.cache.failpoints import Site
from kvwatch.engine.events import EventBus, FailpointFired
from kvwatch.engine.overrides import apply_overrides, assignment
from kvwatch.harness.profiles import PROFILES
from kvwatch.instrumentation import combos
from kvwatch.instrumentation.combo_counter import CombinationCounter
from kvwatch.loadtests.statuses import failpoint_refusal
from kvwatch.server import EngineWorker, ServerSettings, create_app
from kvwatch.targets.kvwatch.replay import reference_engine
from kvwatch.targets.kvwatch.target import KvwatchTarget

MODEL = ServerSettings().model_name


def test_every_profile_is_served_with_failpoints_seeded_by_the_gate(tmp_path):
    target = KvwatchTarget(tmp_path, seed=7)
    for profile in PROFILES.values():
        config = target.engine(profile)
        assert config.cache.failpoints is not None, profile.name
        assert config.cache.failpoints.seed == 7
        assert config.cache.failpoints.first == 8
    # the cache-off reference replays without them
    assert reference_engine(target.engine(PROFILES["agentic-trie"])).config.cache.failpoints is None


def test_engine_sets_apply_in_order_over_every_profile(tmp_path):
    sets = (
        "cache.failpoints=null",
        "scheduler.spec=null",
        "scheduler.prefix_waits=false",
        "cache.full_kv.page_size=8",
        "cache.swa_kv.page_size=8",
        "cache.full_kv.page_size=4",  # the last one wins
    )
    target = KvwatchTarget(tmp_path, engine_sets=sets)
    for profile in PROFILES.values():
        config = target.engine(profile)
        assert config.cache.failpoints is None and config.scheduler.spec is None
        assert config.scheduler.prefix_waits is False
        assert (config.cache.full_kv.page_size, config.cache.swa_kv.page_size) == (4, 8)
    # the profile's own settings stay where not set
    slots = target.engine(PROFILES["slot-cache"])
    assert slots.cache.mode == "slots" and slots.cache.full_kv.capacity == 128


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("cache.nope=1", "unknown config field 'cache.nope'"),
        ("scheduler.chunk_size=null", "must be an integer"),
        ("scheduler.chunk_size", "is not KEY=VALUE"),
        ("cache..mode=radix", "is not KEY=VALUE"),
        ("cache.mode=weird", "unknown prefix cache mode"),
    ],
)
def test_a_bad_engine_set_names_what_is_wrong(tmp_path, text, says):
    with pytest.raises(ValueError, match=says):
        KvwatchTarget(tmp_path, engine_sets=(text,))


def test_an_assignment_is_a_dotted_key_and_a_json_value():
    assert assignment("cache.full_kv.page_size=8") == {"cache": {"full_kv": {"page_size": 8}}}
    assert assignment("cache.mode=slots") == {"cache": {"mode": "slots"}}  # a bare word
    assert assignment('cache.failpoints={"every": 4}') == {"cache": {"failpoints": {"every": 4}}}
    assert apply_overrides(EngineConfig(), assignment("scheduler.spec=null")).scheduler.spec is None


@pytest.mark.parametrize(
    "args",
    [
        ["--engine-set", "cache.nope=1"],
        [
            "--engine-set",
            "cache.mode=slots",
            "--target",
            "http://127.0.0.1:9",
            "--metrics-url",
            "http://127.0.0.1:9/metrics",
        ],
    ],
)
def test_the_gate_refuses_a_bad_or_misplaced_engine_set(tmp_path, args):
    cmd = [sys.executable, "-m", "kvwatch", "gate", "--out", str(tmp_path), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--engine-set" in proc.stderr or "cache.nope" in proc.stderr, proc.stderr
    assert not (tmp_path / "summary.json").exists()


def test_a_fired_failpoint_is_counted_as_its_site_failed():
    bus = EventBus()
    counter = CombinationCounter(bus, page=16, window=32)
    bus.emit(FailpointFired(site=Site.TIER_LOAD, hit=2, group="swa.window"))
    bus.emit(FailpointFired(site=Site.TIER_LOAD, hit=40, group="linear.state"))
    bus.emit(FailpointFired(site=Site.ADMIT_WORKING, hit=1, group="linear.state"))
    assert counter.taken()[combos.FAILPOINT] == {
        "admit.working failed": 1,
        "tier.load failed": 2,
    }
    machine = dict((m[0], m[2]) for m in combos.MACHINES)[combos.FAILPOINT]
    assert set(machine) == {combos.failed(s) for s in Site}


def test_a_request_a_failpoint_failed_is_an_expected_answer_and_nothing_else_is():
    """Through the real server: a lone request whose admission fails answers 400
    naming the failpoint, streamed or not, and the load's test accepts exactly
    that; a 400 for anything else, or a 500, is still a failure."""
    config = apply_overrides(
        EngineConfig(),
        {"cache": {"failpoints": {"first": 1, "every": 2, "sites": ["admit.working"]}}},
    )
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(create_app(EngineWorker(Engine(config)), ServerSettings())) as client:
        failed = client.post("/v1/chat/completions", json=body)
        assert failed.status_code == 400
        message = failed.json()["error"]["message"]
        assert "(failpoint admit.working, hit 1)" in message
        assert failpoint_refusal(400, message)
        assert client.post("/v1/chat/completions", json=body).status_code == 200  # hit 2
        bad = client.post("/v1/chat/completions", json={**body, "max_tokens": -1})
        assert bad.status_code == 400 and not failpoint_refusal(400, bad.text)
    assert not failpoint_refusal(500, message)
    app = create_app(EngineWorker(Engine(config)), ServerSettings())
    stream = {**body, "stream": True}
    with TestClient(app) as client, client.stream("POST", "/v1/chat/completions", json=stream) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in e]
    assert errors and failpoint_refusal(200, errors[0]["message"]), events


def test_the_server_arms_and_disarms_its_failpoints_on_request():
    config = apply_overrides(EngineConfig(), {"cache": {"failpoints": {"first": 1, "every": 2}}})
    engine = Engine(config)
    seen: list[FailpointFired] = []
    engine.events.subscribe(FailpointFired, seen.append)
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello there"}],
    }
    app = create_app(EngineWorker(engine), ServerSettings(enable_probe=True))
    with TestClient(app) as client:
        answer = client.post("/debug/failpoints?armed=false")
        assert answer.status_code == 200 and answer.json() == {"armed": False}
        for _ in range(3):
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert seen == []
        assert client.post("/debug/failpoints").json() == {"armed": True}
        client.post("/v1/chat/completions", json=body)
    assert seen


@pytest.mark.e2e
def test_a_run_at_c1_runs_the_load_as_written_and_c2_takes_failure_paths(tmp_path):
    """One server serves both runs: disarmed for c = 1, armed for c = 2."""
    cmd = [sys.executable, "-m", "kvwatch", "gate", "--out", str(tmp_path), "--no-report"]
    cmd += ["--profile", "agentic-trie", "-c", "1,2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert one["coverage"].get(combos.FAILPOINT, {}) == {}
    assert sum(two["coverage"][combos.FAILPOINT].values()) > 0
