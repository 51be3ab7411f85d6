"""Every malformed request gets an OpenAI-style 4xx, and leaves nothing behind.

The catalogue covers the body (bytes, JSON, types, ranges, sizes), the
headers, the routes and the session lifecycle. Two sessions are set up
first: ``live-session`` (one turn done) and ``closed-session`` (opened,
then closed). Fault names reach the server only as ``kvwatch serve
--inject``; no route takes one, and test_cli.py covers the usage error.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
from fastapi.testclient import TestClient

from kvwatch.engine import Engine
from kvwatch.engine.errors import ErrorKind
from kvwatch.server import EngineWorker, ServerSettings, create_app
from kvwatch.server.http_errors import STATUS

OK_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
OK_TEXT = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
CHAT, TEXT, SESSIONS = "/v1/chat/completions", "/v1/completions", "/v1/sessions"
LIVE, CLOSED = "live-session", "closed-session"
TOKEN = "bad-input-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
MAX_BODY = 64 * 1024


def with_(base: dict, **changes) -> dict:
    out = {**base, **changes}
    return {k: v for k, v in out.items() if v is not ...}


def user(content) -> dict:
    return with_(OK_CHAT, messages=[{"role": "user", "content": content}])


class Bad(NamedTuple):
    name: str
    method: str
    path: str
    body: dict | list | bytes | None  # bytes go out as they are
    status: int
    code: str
    headers: dict | None = None


BAD = [
    # -- the body as bytes ---------------------------------------------------------------
    Bad("not json", "POST", CHAT, b"{nope", 400, "invalid_json"),
    Bad("json with trailing junk", "POST", TEXT, b'{"model":"t","prompt":"x"} junk', 400, "invalid_json"),
    Bad("json array", "POST", CHAT, [1, 2], 400, "invalid_body"),
    Bad("json null", "POST", CHAT, b"null", 400, "invalid_body"),
    Bad("empty body", "POST", TEXT, b"", 400, "invalid_body"),
    Bad("invalid utf-8 bytes", "POST", TEXT, b'{"model":"t","prompt":"\xff\xfe"}', 400, "invalid_json"),
    Bad("nested too deeply", "POST", TEXT, b"[" * 30_000 + b"]" * 30_000, 400, "invalid_json"),
    Bad("integer of 5000 digits", "POST", TEXT, b'{"model":"t","prompt":"x","max_tokens":' + b"9" * 5000 + b"}", 400, "invalid_json"),
    Bad("text/plain body", "POST", TEXT, b'{"model":"t","prompt":"x"}', 400, "invalid_body", {"content-type": "text/plain"}),
    Bad("body too large", "POST", CHAT, b"x" * (MAX_BODY + 6000), 413, "body_too_large"),
    # -- missing fields and wrong types --------------------------------------------------
    Bad("no messages", "POST", CHAT, with_(OK_CHAT, messages=...), 400, "invalid_value"),
    Bad("no model", "POST", CHAT, with_(OK_CHAT, model=...), 400, "invalid_value"),
    Bad("empty model", "POST", CHAT, with_(OK_CHAT, model=""), 400, "invalid_value"),
    Bad("empty messages", "POST", CHAT, with_(OK_CHAT, messages=[]), 400, "invalid_value"),
    Bad("messages an object", "POST", CHAT, with_(OK_CHAT, messages={"role": "user"}), 400, "invalid_value"),
    Bad("message without a role", "POST", CHAT, with_(OK_CHAT, messages=[{"content": "x"}]), 400, "invalid_value"),
    Bad("unknown role", "POST", CHAT, with_(OK_CHAT, messages=[{"role": "wizard", "content": "x"}]), 400, "invalid_value"),
    Bad("content a number", "POST", CHAT, user(5), 400, "invalid_value"),
    Bad("content part of an unknown type", "POST", CHAT, user([{"type": "image_url", "image_url": "x"}]), 400, "invalid_value"),
    Bad("max_tokens a string", "POST", TEXT, with_(OK_TEXT, max_tokens="many"), 400, "invalid_value"),
    Bad("stream a list", "POST", TEXT, with_(OK_TEXT, stream=[1]), 400, "invalid_value"),
    Bad("stream_options a string", "POST", CHAT, with_(OK_CHAT, stream_options="yes"), 400, "invalid_value"),
    Bad("prompt with a string token", "POST", TEXT, with_(OK_TEXT, prompt=[1, "a"]), 400, "invalid_value"),
    Bad("prompt nested list", "POST", TEXT, with_(OK_TEXT, prompt=[[1, 2]]), 400, "invalid_value"),
    # -- values out of range -------------------------------------------------------------
    Bad("max_tokens zero", "POST", CHAT, with_(OK_CHAT, max_tokens=0), 400, "invalid_value"),
    Bad("max_tokens negative", "POST", CHAT, with_(OK_CHAT, max_tokens=-5), 400, "invalid_value"),
    Bad("max_tokens past the context", "POST", TEXT, with_(OK_TEXT, max_tokens=10**6), 400, "context_length_exceeded"),
    Bad("max_tokens past int64", "POST", TEXT, with_(OK_TEXT, max_tokens=10**30), 400, "context_length_exceeded"),
    Bad("max_tokens infinite", "POST", TEXT, b'{"model":"t","prompt":"x","max_tokens":1e400}', 400, "invalid_value"),
    Bad("temperature negative", "POST", TEXT, with_(OK_TEXT, temperature=-1), 400, "invalid_value"),
    Bad("temperature NaN", "POST", TEXT, b'{"model":"t","prompt":"x","temperature":NaN}', 400, "invalid_value"),
    Bad("temperature above two", "POST", TEXT, with_(OK_TEXT, temperature=2.5), 400, "invalid_value"),
    Bad("top_p zero", "POST", TEXT, with_(OK_TEXT, top_p=0), 400, "invalid_value"),
    Bad("n of three", "POST", CHAT, with_(OK_CHAT, n=3), 400, "invalid_value"),
    Bad("n of zero", "POST", CHAT, with_(OK_CHAT, n=0), 400, "invalid_value"),
    Bad("seed negative", "POST", TEXT, with_(OK_TEXT, seed=-5), 400, "invalid_value"),
    Bad("logprobs of five", "POST", TEXT, with_(OK_TEXT, logprobs=5), 400, "invalid_value"),
    Bad("echo", "POST", TEXT, with_(OK_TEXT, echo=True), 400, "invalid_value"),
    Bad("stop strings", "POST", CHAT, with_(OK_CHAT, stop=["\n"]), 400, "invalid_value"),
    Bad("ten thousand stop strings", "POST", TEXT, with_(OK_TEXT, stop=["x"] * 10_000), 400, "invalid_value"),
    # -- prompts the engine refuses ------------------------------------------------------
    Bad("empty prompt", "POST", TEXT, with_(OK_TEXT, prompt=""), 400, "invalid_value"),
    Bad("negative token id", "POST", TEXT, with_(OK_TEXT, prompt=[1, -2]), 400, "invalid_value"),
    Bad("token id past the vocabulary", "POST", TEXT, with_(OK_TEXT, prompt=[1, 99999]), 400, "invalid_prompt"),
    Bad("prompt longer than the context", "POST", TEXT, with_(OK_TEXT, prompt=[65] * 5000), 400, "context_length_exceeded"),
    Bad("lone surrogate in a prompt", "POST", TEXT, b'{"model":"t","prompt":"\\ud800"}', 400, "invalid_prompt"),
    Bad("lone surrogate in a chat message", "POST", CHAT, b'{"model":"t","messages":[{"role":"user","content":"a\\udfffb"}]}', 400, "invalid_prompt"),
    Bad("lone surrogate as the model", "POST", TEXT, b'{"model":"\\ud800","prompt":"x"}', 400, "invalid_value"),
    # -- sessions ------------------------------------------------------------------------
    Bad("unknown session", "POST", CHAT, with_(OK_CHAT, session_id="missing"), 404, "session_not_found"),
    Bad("malformed session id", "POST", CHAT, with_(OK_CHAT, session_id="a b/c"), 400, "invalid_value"),
    Bad("turn on a closed session", "POST", CHAT, with_(OK_CHAT, session_id=CLOSED), 409, "session_closed"),
    Bad("turn that does not extend its session", "POST", TEXT, with_(OK_TEXT, prompt="zzz", session_id=LIVE), 400, "session_not_append_only"),
    Bad("open a session id in use", "POST", SESSIONS, {"session_id": LIVE}, 409, "session_exists"),
    Bad("session id too long", "POST", SESSIONS, {"session_id": "x" * 500}, 400, "invalid_value"),
    Bad("close a closed session", "DELETE", f"{SESSIONS}/{CLOSED}", None, 409, "session_closed"),
    Bad("close an unknown session", "DELETE", f"{SESSIONS}/missing", None, 404, "session_not_found"),
    Bad("session id with bad bytes in the path", "GET", f"{SESSIONS}/%FF%00", None, 400, "invalid_session_id"),
    Bad("rollback of unknown session", "POST", f"{SESSIONS}/missing/rollback", {"steps": 1}, 404, "session_not_found"),
    Bad("rollback zero steps", "POST", f"{SESSIONS}/missing/rollback", {"steps": 0}, 400, "invalid_value"),
    Bad("rollback past the limit", "POST", f"{SESSIONS}/{LIVE}/rollback", {"steps": 5}, 400, "rollback_out_of_range"),
    Bad("trajectory of unknown session", "GET", f"{SESSIONS}/missing/trajectory", None, 404, "session_not_found"),
    Bad("trajectory of an unrecorded session", "GET", f"{SESSIONS}/{LIVE}/trajectory", None, 400, "session_not_recorded"),
    # -- headers, routes and the probe endpoints -----------------------------------------
    Bad("oversized request headers", "POST", CHAT, OK_CHAT, 431, "headers_too_large", {"x-padding": "a" * 20_000}),
    Bad("unknown route", "GET", "/v1/nothing", None, 404, "not_found"),
    Bad("wrong method", "GET", CHAT, None, 405, "method_not_allowed"),
    Bad("probe without its token", "GET", "/debug/probe", None, 401, "unauthorized"),
    Bad("probe with a wrong token", "GET", "/debug/probe", None, 401, "unauthorized", {"authorization": "Bearer nope"}),
    Bad("tracemalloc zero frames", "POST", "/debug/tracemalloc/start?frames=0", None, 400, "invalid_value", AUTH),
    Bad("tracemalloc unknown scope", "GET", "/debug/tracemalloc/snapshot?scope=bogus", None, 400, "invalid_value", AUTH),
]  # fmt: skip


def usage(engine: Engine) -> dict[str, tuple[int, dict[str, int]]]:
    """Free pages and pages by owner, per pool."""
    return {name: (g.free, g.by_owner) for name, g in engine.probe().groups.items()}


@pytest.fixture(scope="module")
def api():
    engine = Engine()
    baseline = usage(engine)
    settings = ServerSettings(max_body_bytes=MAX_BODY, enable_probe=True, probe_token=TOKEN)
    with TestClient(create_app(EngineWorker(engine), settings)) as client:
        client.engine, client.baseline = engine, baseline
        for sid in (LIVE, CLOSED):
            assert client.post(SESSIONS, json={"session_id": sid}).status_code == 200
        assert client.post(CHAT, json=with_(OK_CHAT, session_id=LIVE)).status_code == 200
        assert client.delete(f"{SESSIONS}/{CLOSED}").status_code == 200
        yield client


def send(api, bad: Bad):
    headers = dict(bad.headers or {})
    if isinstance(bad.body, bytes):
        headers.setdefault("content-type", "application/json")
        return api.request(bad.method, bad.path, content=bad.body, headers=headers)
    return api.request(bad.method, bad.path, json=bad.body, headers=headers)


def test_there_are_at_least_thirty_distinct_bad_inputs():
    assert len({b.name for b in BAD}) == len(BAD) >= 30
    assert len({(b.method, b.path, repr(b.body), repr(b.headers)) for b in BAD}) == len(BAD)


@pytest.mark.parametrize("bad", BAD, ids=[b.name for b in BAD])
def test_bad_input_gets_an_openai_error(api, bad):
    r = send(api, bad)
    assert r.status_code == bad.status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["message"] and error["type"]
    assert error["code"] == bad.code, error


def test_after_every_bad_input_the_engine_is_clean_and_back_to_its_baseline(api):
    for bad in BAD:
        assert send(api, bad).status_code < 500, bad.name
    assert api.post(CHAT, json=OK_CHAT).status_code == 200
    assert api.delete(f"{SESSIONS}/{LIVE}").status_code == 200
    worker, engine = api.app.state.worker, api.engine
    worker.call(engine.flush_cache).result(300)
    report = worker.call(engine.probe).result(300)
    assert report.clean, report.findings
    assert report.live_requests == 0 and report.live_sessions == 0
    assert not engine.request_ids()  # nothing half-added
    assert worker.call(usage, engine).result(300) == api.baseline


def test_every_kind_of_engine_error_has_its_one_status():
    """The engine names the kind of mistake; the server's one table gives the status
    clients have always seen for it (400 invalid, 404 not found, 409 conflict)."""
    assert STATUS == {ErrorKind.INVALID: 400, ErrorKind.NOT_FOUND: 404, ErrorKind.CONFLICT: 409}
    assert set(STATUS) == set(ErrorKind)
