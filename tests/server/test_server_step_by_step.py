"""Serving step by step (``--enable-probe --step-by-step``), and what a client of it reads.

* the engine steps only on ``POST /debug/step``: a request sent waits, listed as
  ``waiting`` at step 0, until a client asks for a step;
* with the probe on, ``X-Request-Id`` names the engine's request (without it, the
  engine numbers requests, whatever the header says);
* with ``return_token_ids``, a streamed answer carries every generated token id in its
  chunks (the same ids the answer as one JSON body gives) and the prompt's in its last;
* ``GET /v1/sessions/{id}`` gives the session's ``token_ids``, the prefix its next turn
  must start with.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from inprocserver import serving

from kvwatch import MODEL_NAME
from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings

STEPPED = ServerSettings(enable_probe=True, step_by_step=True)
PROMPT = list(range(40, 60))


def _served(settings: ServerSettings):
    app, _, telemetry = build(ServeOptions(settings=settings))
    return app, telemetry


def _listed(client: httpx.Client) -> dict:
    return client.get("/debug/requests").json()


def _until(what, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (got := what()):
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.01)
    return got


def test_step_by_step_needs_the_probe():
    with pytest.raises(ValueError, match="step_by_step needs enable_probe"):
        ServerSettings(step_by_step=True)


def test_the_engine_steps_only_when_asked_and_the_client_names_its_request():
    app, telemetry = _served(STEPPED)
    try:
        with serving(app) as url, httpx.Client(base_url=url, timeout=120) as client:
            answer: dict = {}
            body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 3, "temperature": 0}

            def send() -> None:
                headers = {"X-Request-Id": "mine-1"}
                answer["r"] = httpx.post(
                    f"{url}/v1/completions", json=body, headers=headers, timeout=120
                )

            sender = threading.Thread(target=send)
            sender.start()
            listed = _until(lambda: _listed(client)["requests"])
            assert [(r["id"], r["status"]) for r in listed] == [("mine-1", "waiting")]
            time.sleep(0.3)  # nothing steps on its own
            assert _listed(client)["step"] == 0 and "r" not in answer
            steps = 0
            while _listed(client)["requests"]:
                data = client.post("/debug/step").json()
                steps += 1
                assert data["step"] == steps
            sender.join(60)
            assert answer["r"].status_code == 200
            assert answer["r"].json()["id"].endswith("mine-1")
            assert answer["r"].json()["usage"]["completion_tokens"] == 3
    finally:
        telemetry.shutdown()


def test_without_the_probe_the_engine_numbers_its_requests():
    app, telemetry = _served(ServerSettings())
    try:
        with serving(app) as url:
            body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 1}
            got = httpx.post(
                f"{url}/v1/completions", json=body, headers={"X-Request-Id": "mine-2"}, timeout=120
            )
            assert got.status_code == 200 and "mine-2" not in got.json()["id"]
    finally:
        telemetry.shutdown()


def test_streamed_chunks_carry_every_token_id_and_the_last_the_prompts():
    app, telemetry = _served(ServerSettings(enable_probe=True))
    try:
        with serving(app) as url, httpx.Client(base_url=url, timeout=120) as client:
            body = {
                "model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True,
            }  # fmt: skip
            whole = client.post("/v1/completions", json=body).json()
            ids, last = [], None
            with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: {"):
                        last = json.loads(line[len("data: ") :])
                        ids.extend(last["choices"][0]["token_ids"])
            assert ids == whole["choices"][0]["token_ids"] and len(ids) == 12
            assert last["prompt_token_ids"] == whole["prompt_token_ids"] == PROMPT
            plain = client.post("/v1/completions", json={**body, "return_token_ids": False})
            assert "token_ids" not in plain.json()["choices"][0]
    finally:
        telemetry.shutdown()


def test_a_session_tells_the_tokens_its_next_turn_starts_with():
    app, telemetry = _served(ServerSettings(enable_probe=True))
    try:
        with serving(app) as url, httpx.Client(base_url=url, timeout=120) as client:
            assert client.post("/v1/sessions", json={"session_id": "s1"}).status_code == 200
            assert client.get("/v1/sessions/s1").json()["token_ids"] == []
            body = {
                "model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                "session_id": "s1", "return_token_ids": True,
            }  # fmt: skip
            turn = client.post("/v1/completions", json=body).json()
            held = client.get("/v1/sessions/s1").json()
            assert held["token_ids"] == PROMPT + turn["choices"][0]["token_ids"]
            assert held["tokens"] == len(held["token_ids"])
    finally:
        telemetry.shutdown()
