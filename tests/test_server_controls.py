"""The per-request test controls (``kvwatch`` field, ``--enable-probe``): a request
the engine retracts, then aborts while retracted or recovering, still gets an
answer that says so, and leaves nothing behind."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from kvwatch.engine import Engine
from kvwatch.server import EngineWorker, ServerSettings, create_app

MODEL = ServerSettings().model_name
PROMPT = "a prompt long enough to be pushed out after a few tokens " * 3


@pytest.fixture
def served():
    worker = EngineWorker(Engine())
    with TestClient(create_app(worker, ServerSettings(enable_probe=True))) as client:
        yield client, worker


def _body(state: str, stream: bool) -> dict:
    hold = 100_000 if state == "retracted" else 2
    controls = {"retract_after": 4, "hold_steps": hold, "abort_in": state}
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0,
            "stream": stream, "kvwatch": controls}  # fmt: skip


@pytest.mark.parametrize("state", ["retracted", "recovering"])
def test_an_aborted_request_is_answered(served, state):
    client, worker = served
    done = client.post("/v1/completions", json=_body(state, stream=False))  # hung before the fix
    assert done.status_code == 200, done.text
    assert done.json()["choices"][0]["finish_reason"] == "abort"
    with client.stream("POST", "/v1/completions", json=_body(state, stream=True)) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"
    assert client.post("/debug/flush_cache").status_code == 200
    report = worker.call(worker.engine.probe).result(60)
    assert report.clean and all(g.free == g.capacity for g in report.groups.values())
    assert worker.call(lambda: dict(worker._streams)).result(60) == {}
