"""A step that raises outside the engine's per-request failure paths is a bug in
the engine; the server must not hang on it or spin on it. The streams in flight
end with an error, new requests get a JSON 503, and /health says so."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from kvwatch.engine import Engine
from kvwatch.server import ServerSettings, create_app
from kvwatch.server.worker import EngineWorker

FAIL_AT_STEP = 3


def test_a_step_that_raises_ends_the_streams_and_refuses_new_requests(monkeypatch):
    engine = Engine()
    real_step, steps = engine.step, []

    def step():
        steps.append(1)
        if len(steps) >= FAIL_AT_STEP:
            raise RuntimeError("a scheduler bug")
        return real_step()

    monkeypatch.setattr(engine, "step", step)
    app = create_app(EngineWorker(engine), ServerSettings())
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": 40,
        "stream": True,
    }
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            events = [
                json.loads(line[len("data: ") :])
                for line in response.iter_lines()
                if line.startswith("data: {")
            ]
        error = events[-1]["error"]
        assert error["code"] == "internal_error" and "the engine stopped" in error["message"]
        refused = client.post("/v1/chat/completions", json={**body, "stream": False})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "engine_stopped"
        health = client.get("/health")
        assert health.status_code == 503 and "a scheduler bug" in health.json()["error"]
    assert len(steps) == FAIL_AT_STEP  # the worker stopped stepping; it did not spin
