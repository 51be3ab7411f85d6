"""The per-request test controls (``kvwatch`` field, ``--enable-probe``): a request
the engine retracts or pauses, then aborts while retracted, paused or
recovering, still gets an answer that says so, and leaves nothing behind; one
paused and resumed answers as if nothing happened. An abort alone lands in the
stage it names (queued, prefilling, decoding, verifying), and a pause held by
time is not resumed before its time."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from kvwatch.engine import Engine, EngineConfig, SchedulerConfig, SpecConfig
from kvwatch.engine.events import (
    FailpointFired,
    RequestAborted,
    RequestPaused,
    RequestRecovered,
)
from kvwatch.server import EngineWorker, ServerSettings, create_app

MODEL = ServerSettings().model_name
PROMPT = "a prompt long enough to be pushed out after a few tokens " * 3


@pytest.fixture
def served():
    worker = EngineWorker(Engine())
    with TestClient(create_app(worker, ServerSettings(enable_probe=True))) as client:
        yield client, worker


def _body(state: str | None, stream: bool, how: str = "retract_after") -> dict:
    hold = 100_000 if state in ("retracted", "paused") else 2
    controls = {how: 4, "hold_steps": hold, "abort_in": state}
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0,
            "stream": stream, "kvwatch": controls}  # fmt: skip


def _quiet(client, worker) -> None:
    assert client.post("/debug/flush_cache").status_code == 200
    report = worker.call(worker.engine.probe).result(60)
    assert report.clean and all(g.free == g.capacity for g in report.groups.values())
    assert worker.call(lambda: dict(worker._streams)).result(60) == {}
    assert worker.call(lambda: (worker._scripted, worker._abort_in, worker._held)).result(60) == (
        {},
        {},
        {},
    )


@pytest.mark.parametrize(
    "state, how",
    [("retracted", "retract_after"), ("recovering", "retract_after"),
     ("paused", "pause_after_output"), ("recovering", "pause_after_output")],
)  # fmt: skip
def test_an_aborted_request_is_answered(served, state, how):
    client, worker = served
    stages = []
    worker.engine.events.subscribe(RequestAborted, lambda e: stages.append(e.stage))
    done = client.post("/v1/completions", json=_body(state, False, how))  # hung before the fix
    assert done.status_code == 200, done.text
    assert done.json()["choices"][0]["finish_reason"] == "abort"
    with client.stream("POST", "/v1/completions", json=_body(state, True, how)) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"
    # the engine's own abort, in the state asked for (recovering: admitted again)
    want = {"recovering": {"prefill", "decode"}}.get(state, {state})
    assert len(stages) == 2 and set(stages) <= want, stages
    _quiet(client, worker)


@pytest.mark.parametrize("stream", [False, True])
def test_a_paused_and_resumed_request_answers_as_an_undisturbed_one(served, stream):
    client, worker = served
    paused = []
    worker.engine.events.subscribe(RequestPaused, paused.append)
    plain = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0}
    want = client.post("/v1/completions", json=plain).json()["choices"][0]["text"]
    body = _body(None, stream, "pause_after_output")
    if stream:
        with client.stream("POST", "/v1/completions", json=body) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
        got, reason = "".join(c["text"] for c in chunks), chunks[-1]["finish_reason"]
    else:
        choice = client.post("/v1/completions", json=body).json()["choices"][0]
        got, reason = choice["text"], choice["finish_reason"]
    assert len(paused) == 1 and reason == "length"
    assert got == want
    _quiet(client, worker)


@pytest.mark.parametrize(
    "controls",
    [{"abort_in": "paused"}, {"retract_after": 4, "abort_in": "paused"},
     {"pause_after_output": 4, "abort_in": "retracted"},
     {"retract_after": 4, "pause_after_output": 4}, {"pause_after_output": 0},
     {"fail_load": True}, {"pause_after_output": 4, "fail_load": True}],
)  # fmt: skip
def test_controls_that_cannot_be_carried_out_are_refused(served, controls):
    client, worker = served
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "kvwatch": controls}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_value"
    assert worker.call(worker.engine.request_ids).result(60) == ()


@pytest.fixture
def speculating():
    config = EngineConfig(scheduler=SchedulerConfig(spec=SpecConfig(num_drafts=4)))
    worker = EngineWorker(Engine(config))
    with TestClient(create_app(worker, ServerSettings(enable_probe=True))) as client:
        yield client, worker


@pytest.mark.parametrize(
    "stage, engine_stage",
    [("queued", "queued"), ("prefilling", "prefill"), ("decoding", "decode"),
     ("verifying", "verify")],
)  # fmt: skip
def test_an_abort_alone_lands_in_its_stage(speculating, stage, engine_stage):
    client, worker = speculating
    stages = []
    worker.engine.events.subscribe(RequestAborted, lambda e: stages.append(e.stage))
    body = {"model": MODEL, "prompt": PROMPT * 2, "max_tokens": 6, "temperature": 0.0,
            "kvwatch": {"abort_in": stage}}  # fmt: skip
    done = client.post("/v1/completions", json=body)
    assert done.status_code == 200 and done.json()["choices"][0]["finish_reason"] == "abort"
    assert stages == [engine_stage]
    _quiet(client, worker)


def test_a_pause_held_by_time_is_not_resumed_before_its_time(served):
    client, worker = served
    resumed = []
    worker.engine.events.subscribe(RequestRecovered, lambda e: resumed.append(time.monotonic()))
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0,
            "kvwatch": {"pause_after_output": 2, "hold_s": 1.0}}  # fmt: skip
    start = time.monotonic()
    done = client.post("/v1/completions", json=body)  # nothing else runs: no early resume
    assert done.json()["choices"][0]["finish_reason"] == "length"
    assert len(resumed) == 1 and resumed[0] - start >= 1.0
    assert worker.call(lambda: worker._held_until).result(60) == {}
    _quiet(client, worker)


@pytest.mark.parametrize(
    "controls",
    [{"hold_s": 1.0}, {"retract_after": 4, "hold_s": 1.0},
     {"retract_after": 4, "abort_in": "queued"}, {"pause_after_output": 2, "abort_in": "decoding"},
     {"pause_after_output": 2, "hold_s": 0}],
)  # fmt: skip
def test_timed_holds_and_lone_aborts_that_cannot_be_carried_out_are_refused(served, controls):
    client, worker = served
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "kvwatch": controls}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert worker.call(worker.engine.request_ids).result(60) == ()


def test_a_retraction_whose_load_fails_recovers_from_nothing_and_answers_the_same(served):
    """``fail_load``: the request comes back from the host tier, its snapshot's load
    fails as a full device pool fails it, and it recomputes its prompt: the same
    greedy answer as without the control, nothing left behind."""
    client, worker = served
    plain = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0}
    want = client.post("/v1/completions", json=plain).json()["choices"][0]["text"]
    assert client.post("/debug/flush_cache").status_code == 200
    fired = []
    worker.engine.events.subscribe(FailpointFired, fired.append)
    controls = {"retract_after": 4, "hold_steps": 2, "fail_load": True}
    r = client.post("/v1/completions", json={**plain, "kvwatch": controls})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == want
    assert [f.site for f in fired] == ["tier.load"]  # failpoints are off: this one only
    _quiet(client, worker)
