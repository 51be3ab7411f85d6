"""``--session-idle-timeout``: sessions nobody uses are closed; used or busy ones stay open."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from kvwatch.cli import build_parser
from kvwatch.engine import Engine
from kvwatch.server import EngineWorker, ServerSettings, create_app
from kvwatch.server.idle import SessionClock

SESSIONS = "/v1/sessions"


def turn(client: TestClient, sid: str, content: str = "hello", max_tokens: int = 4):
    body = {
        "model": "t",
        "session_id": sid,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    return client.post("/v1/chat/completions", json=body)


def serve(timeout: float | None) -> TestClient:
    engine = Engine()
    settings = ServerSettings(session_idle_timeout_s=timeout)
    client = TestClient(create_app(EngineWorker(engine), settings))
    client.engine = engine
    return client


def test_the_timeout_is_off_by_default():
    assert ServerSettings().session_idle_timeout_s is None
    assert build_parser().parse_args(["serve"]).session_idle_timeout is None


def test_the_clock_keeps_only_opened_sessions():
    now = [100.0]
    clock = SessionClock(now=lambda: now[0])
    clock.opened("a")
    clock.touch("never-opened")
    now[0] = 105.0
    clock.opened("b")
    assert clock.unused_for(5) == ["a"]
    clock.touch("a")
    assert clock.unused_for(5) == []
    clock.forget("a")
    now[0] = 200.0
    assert clock.unused_for(5) == ["b"]


def test_a_session_idle_past_the_timeout_is_closed_and_a_used_one_stays_open():
    client = serve(0.6)
    with client:
        idle, used = (client.post(SESSIONS, json={}).json()["id"] for _ in range(2))
        assert turn(client, idle, "a first turn long enough to fill pages " * 3).status_code == 200
        assert turn(client, used).status_code == 200
        deadline = time.monotonic() + 1.8
        while time.monotonic() < deadline:  # three timeouts; `used` is read every 0.15 s
            assert client.get(f"{SESSIONS}/{used}").status_code == 200
            time.sleep(0.15)
        gone = client.get(f"{SESSIONS}/{idle}")
        assert gone.status_code == 409 and gone.json()["error"]["code"] == "session_closed"
        assert turn(client, idle, "again").status_code == 409
        assert turn(client, used, "again").status_code == 200
        report = client.app.state.worker.call(client.engine.probe).result(30)
        assert report.live_sessions == 1 and report.clean, report.findings
        assert report.groups["full.kv"].by_owner["tree"] > 0  # closing put its tokens in the tree


def test_a_turn_longer_than_the_timeout_keeps_its_session_open(monkeypatch):
    client = serve(0.3)
    run = client.engine.runner.run

    def slow_run(works):
        time.sleep(0.03)
        return run(works)

    monkeypatch.setattr(client.engine.runner, "run", slow_run)
    with client:
        sid = client.post(SESSIONS, json={}).json()["id"]
        started = time.monotonic()
        assert turn(client, sid, max_tokens=40).status_code == 200
        assert time.monotonic() - started > 0.6  # the turn outlasted the timeout twice
        assert client.get(f"{SESSIONS}/{sid}").status_code == 200
        time.sleep(0.8)
        assert client.get(f"{SESSIONS}/{sid}").status_code == 409  # then idle: closed
