"""``--session-idle-timeout``: sessions nobody uses are closed; used or busy ones stay open.

The server's session clock is a hand-moved one here, and sweeps are run when
the test says: which sessions close depends on the clock's readings and on
the turns in flight, so no verdict below depends on how fast the machine is.
One test leaves the real clock and the server's own sweeping task in place,
and only waits (with a generous deadline) for an idle session to go.
"""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from kvwatch.cli import build_parser
from kvwatch.engine import Engine
from kvwatch.engine.events import SessionBusy
from kvwatch.server import EngineWorker, ServerSettings, create_app
from kvwatch.server.idle import SessionClock, close_if_idle

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


class HandClock:
    """Monotonic seconds that move only when the test moves them."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def serve(timeout: float | None, hand: HandClock | None = None) -> TestClient:
    engine = Engine()
    settings = ServerSettings(session_idle_timeout_s=timeout)
    clock = SessionClock(now=hand) if hand is not None else None
    client = TestClient(create_app(EngineWorker(engine), settings, clock=clock))
    client.engine = engine
    return client


def sweep(client: TestClient) -> list[str]:
    """One round of the server's idle reaper, on its event loop; the sessions it closed."""
    return client.portal.call(client.app.state.reaper.sweep)


def status(client: TestClient, sid: str) -> int:
    return client.get(f"{SESSIONS}/{sid}").status_code


def test_the_timeout_is_off_by_default():
    assert ServerSettings().session_idle_timeout_s is None
    assert build_parser().parse_args(["serve"]).session_idle_timeout is None
    assert create_app(EngineWorker(Engine()), ServerSettings()).app.state.reaper is None


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
    hand = HandClock()
    client = serve(10, hand)
    with client:
        idle, used = (client.post(SESSIONS, json={}).json()["id"] for _ in range(2))
        assert turn(client, idle, "a first turn long enough to fill pages " * 3).status_code == 200
        assert turn(client, used).status_code == 200
        for _ in range(3):  # 3 x 6 s: `idle` is past the timeout, `used` never is
            hand.advance(6)
            assert status(client, used) == 200
            closed = sweep(client)
            assert used not in closed
        assert idle not in client.app.state.worker.call(client.engine.open_sessions).result(60)
        gone = client.get(f"{SESSIONS}/{idle}")
        assert gone.status_code == 409 and gone.json()["error"]["code"] == "session_closed"
        assert turn(client, idle, "again").status_code == 409
        assert turn(client, used, "again").status_code == 200
        report = client.app.state.worker.call(client.engine.probe).result(300)
        assert report.live_sessions == 1 and report.clean, report.findings
        assert report.groups["full.kv"].by_owner["tree"] > 0  # closing put its tokens in the tree


def test_a_turn_longer_than_the_timeout_keeps_its_session_open(monkeypatch):
    """Every engine step takes half a (hand-moved) second; ten steps in, with the
    session's last use 5 s ago and a timeout of 1 s, a sweep runs on the engine
    thread between two steps, the way the reaper's sweeps do, and must leave it."""
    hand = HandClock()
    client = serve(1, hand)
    engine, worker = client.engine, client.app.state.worker
    run, steps, mid_turn = engine._runner.run, [0], []

    def slow_run(works):
        hand.advance(0.5)
        steps[0] += 1
        if steps[0] == 10:
            sid = next(iter(engine.open_sessions()))  # on the engine thread
            mid_turn.append(worker.call(close_if_idle, engine, client.app.state.clock, [sid], 1))
        return run(works)

    monkeypatch.setattr(engine._runner, "run", slow_run)
    refused: list[SessionBusy] = []
    engine.events.subscribe(SessionBusy, refused.append)
    with client:
        sid = client.post(SESSIONS, json={}).json()["id"]
        started = hand()
        assert turn(client, sid, max_tokens=40).status_code == 200
        assert hand() - started >= 10  # the turn outlasted the timeout many times
        assert mid_turn[0].result(300) == []  # in flight: not closed
        # refused, and said so (the reaper's own rounds may have tried too)
        assert refused and {(e.session_id, e.action) for e in refused} == {(sid, "idle timeout")}
        assert status(client, sid) == 200 and sweep(client) == []  # just used
        hand.advance(1.5)
        assert sweep(client) == [sid] and status(client, sid) == 409  # then idle: closed


def test_the_server_closes_an_idle_session_on_its_own():
    """The real clock and the server's own sweeping task: an unused session goes."""
    with serve(0.3) as client:
        sid = client.post(SESSIONS, json={}).json()["id"]
        deadline = time.monotonic() + 120
        open_sessions = client.app.state.worker.call
        while sid in open_sessions(client.engine.open_sessions).result(60):
            assert time.monotonic() < deadline, "the idle session was never closed"
            time.sleep(0.05)
        assert status(client, sid) == 409
