"""Every malformed request gets an OpenAI-style 4xx, and leaves nothing behind."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kvwatch.engine import Engine
from kvwatch.server import EngineWorker, ServerSettings, create_app

OK_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
OK_TEXT = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"


def with_(base: dict, **changes) -> dict:
    out = {**base, **changes}
    return {k: v for k, v in out.items() if v is not ...}


# (name, method, path, json body or raw bytes, expected status, expected error code or None)
BAD = [
    ("not json", "POST", CHAT, b"{nope", 400, "invalid_json"),
    ("json array", "POST", CHAT, [1, 2], 400, "invalid_body"),
    ("empty body", "POST", TEXT, b"", 400, None),
    ("no messages", "POST", CHAT, with_(OK_CHAT, messages=...), 400, "invalid_value"),
    ("empty messages", "POST", CHAT, with_(OK_CHAT, messages=[]), 400, "invalid_value"),
    (
        "unknown role",
        "POST",
        CHAT,
        with_(OK_CHAT, messages=[{"role": "wizard", "content": "x"}]),
        400,
        "invalid_value",
    ),
    (
        "content a number",
        "POST",
        CHAT,
        with_(OK_CHAT, messages=[{"role": "user", "content": 5}]),
        400,
        "invalid_value",
    ),
    ("no model", "POST", CHAT, with_(OK_CHAT, model=...), 400, "invalid_value"),
    ("max_tokens zero", "POST", CHAT, with_(OK_CHAT, max_tokens=0), 400, "invalid_value"),
    ("max_tokens a string", "POST", TEXT, with_(OK_TEXT, max_tokens="many"), 400, "invalid_value"),
    ("temperature negative", "POST", TEXT, with_(OK_TEXT, temperature=-1), 400, "invalid_value"),
    ("top_p zero", "POST", TEXT, with_(OK_TEXT, top_p=0), 400, "invalid_value"),
    ("n of three", "POST", CHAT, with_(OK_CHAT, n=3), 400, "invalid_value"),
    ("stop strings", "POST", CHAT, with_(OK_CHAT, stop=["\n"]), 400, "invalid_value"),
    ("empty prompt", "POST", TEXT, with_(OK_TEXT, prompt=""), 400, "invalid_value"),
    ("negative token id", "POST", TEXT, with_(OK_TEXT, prompt=[1, -2]), 400, "invalid_value"),
    (
        "token id past the vocabulary",
        "POST",
        TEXT,
        with_(OK_TEXT, prompt=[1, 99999]),
        400,
        "invalid_prompt",
    ),
    (
        "prompt longer than the context",
        "POST",
        TEXT,
        with_(OK_TEXT, prompt=[65] * 5000),
        400,
        "context_length_exceeded",
    ),
    (
        "max_tokens past the context",
        "POST",
        TEXT,
        with_(OK_TEXT, max_tokens=10**6),
        400,
        "context_length_exceeded",
    ),
    ("lone surrogate", "POST", TEXT, b'{"model":"t","prompt":"\\ud800"}', 400, "invalid_prompt"),
    ("echo", "POST", TEXT, with_(OK_TEXT, echo=True), 400, "invalid_value"),
    ("seed negative", "POST", TEXT, with_(OK_TEXT, seed=-5), 400, "invalid_value"),
    (
        "unknown session",
        "POST",
        CHAT,
        with_(OK_CHAT, session_id="missing"),
        404,
        "session_not_found",
    ),
    (
        "malformed session id",
        "POST",
        CHAT,
        with_(OK_CHAT, session_id="a b/c"),
        400,
        "invalid_value",
    ),
    (
        "rollback of unknown session",
        "POST",
        "/v1/sessions/missing/rollback",
        {"steps": 1},
        404,
        "session_not_found",
    ),
    (
        "rollback zero steps",
        "POST",
        "/v1/sessions/missing/rollback",
        {"steps": 0},
        400,
        "invalid_value",
    ),
    (
        "trajectory of unknown session",
        "GET",
        "/v1/sessions/missing/trajectory",
        None,
        404,
        "session_not_found",
    ),
    ("close an unknown session", "DELETE", "/v1/sessions/missing", None, 404, "session_not_found"),
    (
        "session id too long",
        "POST",
        "/v1/sessions",
        {"session_id": "x" * 500},
        400,
        "invalid_value",
    ),
    ("unknown route", "GET", "/v1/nothing", None, 404, None),
    ("wrong method", "GET", CHAT, None, 405, None),
    ("body too large", "POST", CHAT, b"x" * 70_000, 413, "body_too_large"),
]


@pytest.fixture(scope="module")
def api():
    engine = Engine()
    app = create_app(EngineWorker(engine), ServerSettings(max_body_bytes=64 * 1024))
    with TestClient(app) as client:
        client.engine = engine
        yield client


def send(api, method: str, path: str, body):
    if isinstance(body, bytes):
        return api.request(method, path, content=body, headers={"content-type": "application/json"})
    return api.request(method, path, json=body)


def test_there_are_at_least_twenty_bad_inputs():
    assert len(BAD) >= 20


@pytest.mark.parametrize(
    ("name", "method", "path", "body", "status", "code"), BAD, ids=[b[0] for b in BAD]
)
def test_bad_input_gets_an_openai_error(api, name, method, path, body, status, code):
    r = send(api, method, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"]
    if code is not None:
        assert error["code"] == code, error


def test_after_every_bad_input_the_engine_is_clean_and_still_serves(api):
    for _, method, path, body, _, _ in BAD:
        send(api, method, path, body)
    assert api.post(CHAT, json=OK_CHAT).status_code == 200
    report = api.app.state.worker.call(api.engine.probe).result(30)
    assert report.clean, report.findings
    assert report.live_requests == 0 and report.live_sessions == 0
    assert not api.engine.requests  # nothing half-added
