"""The per-request test controls (``kvwatch`` field, ``--enable-probe``): a request
the engine retracts or pauses, then aborts while retracted, paused or
recovering, still gets an answer that says so, and leaves nothing behind; one
paused and resumed answers as if nothing happened."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from kvwatch.engine import Engine
from kvwatch.engine.events import RequestAborted, RequestPaused
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
     {"retract_after": 4, "pause_after_output": 4}, {"pause_after_output": 0}],
)  # fmt: skip
def test_controls_that_cannot_be_carried_out_are_refused(served, controls):
    client, worker = served
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "kvwatch": controls}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_value"
    assert worker.call(worker.engine.request_ids).result(60) == ()
