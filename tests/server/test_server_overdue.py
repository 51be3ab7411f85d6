"""The idle-timeout oracle: a session unused past ``--session-idle-timeout`` must be closed.

The oracle (``server/overdue.py``) hears every use itself and reports a session
still open well past its due, once the engine stepped on or the reaper swept
since: a reaper that stops closing sessions fails the run, one that closes them
passes. Clocks are hand-moved, so no verdict depends on the machine's speed.
"""

from __future__ import annotations

from fastapi.testclient import TestClient

from kvwatch.contracts import FindingKind, ProbeReport
from kvwatch.engine import Engine
from kvwatch.engine.events import (
    EventBus,
    RequestAdded,
    RequestFinished,
    SessionClosed,
    SessionOpened,
)
from kvwatch.server import EngineWorker, ServerSettings, create_app
from kvwatch.server import idle as idle_module
from kvwatch.server.idle import SessionClock
from kvwatch.server.overdue import OVERDUE_S, OVERDUE_STEPS, IdleDeadlines

TIMEOUT = 5.0
SESSIONS = "/v1/sessions"


class HandClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class Oracle:
    """``IdleDeadlines`` on a bus of its own, with sweeps the test says happened."""

    def __init__(self) -> None:
        self.hand, self.bus, self.swept = HandClock(), EventBus(), []
        self.deadlines = IdleDeadlines(TIMEOUT, self.sweeps_after, now=self.hand)
        self.deadlines.follow(self.bus)
        self.open: set[str] = set()

    def sweeps_after(self, t: float) -> int:
        return sum(1 for began in self.swept if began > t)

    def opened(self, sid: str) -> None:
        self.open.add(sid)
        self.bus.emit(SessionOpened(session_id=sid))

    def check(self, step: int) -> list[str]:
        self.deadlines.check(step, lambda: set(self.open))
        return [f.key for f in self.deadlines.findings() if f.kind is FindingKind.OVERDUE]


def test_a_session_left_open_on_a_busy_engine_is_overdue_after_the_margin():
    o = Oracle()
    o.opened("s")
    o.hand.advance(TIMEOUT + 0.5)
    assert o.check(step=100) == []  # due, but within the margin
    o.hand.advance(OVERDUE_S)
    assert o.check(step=100 + OVERDUE_STEPS - 1) == []  # the margin in seconds, not in steps
    found = o.check(step=100 + OVERDUE_STEPS)
    assert found == ["s"]
    assert o.check(step=200) == []  # reported once


def test_an_idle_server_needs_two_sweeps_after_the_due_not_steps():
    o = Oracle()
    o.opened("s")
    o.hand.advance(TIMEOUT + OVERDUE_S + 1)
    o.swept.append(o.hand() - 0.5)
    assert o.check(step=7) == []  # one sweep since the due: it may be closing it now
    o.swept.append(o.hand())
    assert o.check(step=7) == ["s"]


def test_uses_turns_in_flight_and_closes_keep_a_session_off_the_list():
    o = Oracle()
    for sid in ("used", "busy", "closed"):
        o.opened(sid)
    o.hand.advance(TIMEOUT - 1)
    o.deadlines.used("used")  # a session route used it
    o.bus.emit(RequestAdded(request_id="r1", prompt_tokens=4, step=0, session_id="busy"))
    o.open.discard("closed")
    o.bus.emit(SessionClosed(session_id="closed", reason="closed"))
    o.hand.advance(TIMEOUT + OVERDUE_S)
    o.swept += [o.hand(), o.hand()]
    assert o.check(step=10_000) == ["used"]  # its use was long ago by now
    o.bus.emit(
        RequestFinished(
            request_id="r1", reason="length", prompt_tokens=4, output_tokens=2, cached_tokens=0
        )
    )
    assert o.check(step=20_000) == []  # its turn just ended: a use
    assert o.deadlines._last.keys() == {"used", "busy"}  # the closed one is forgotten
    for sid in ("used", "busy"):
        o.bus.emit(SessionClosed(session_id=sid, reason="closed"))
    assert not o.deadlines._last and not o.deadlines._reported and not o.deadlines._due_step


def serve(hand: HandClock) -> TestClient:
    settings = ServerSettings(session_idle_timeout_s=TIMEOUT, enable_probe=True)
    app = create_app(EngineWorker(Engine()), settings, clock=SessionClock(now=hand))
    return TestClient(app)


def overdue_after_two_sweeps(monkeypatch, reaper_closes: bool) -> list[str]:
    """An idle session, past its timeout and the margin, with two sweeps of the
    server's reaper since (the real one, or one that never closes anything)."""
    if not reaper_closes:
        monkeypatch.setattr(idle_module, "close_if_idle", lambda *args: [])
    hand = HandClock()
    with serve(hand) as client:
        reaper = client.app.state.reaper
        sid = client.post(SESSIONS, json={}).json()["id"]
        body = {"model": "t", "session_id": sid, "max_tokens": 3, "ignore_eos": True}
        body["messages"] = [{"role": "user", "content": "a turn to fill a few pages"}]
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        hand.advance(TIMEOUT + OVERDUE_S + 1)
        for _ in range(2):
            client.portal.call(reaper.sweep)
            hand.advance(0.5)
        report = ProbeReport.from_json(client.get("/debug/probe").json())
        closed = client.get(f"{SESSIONS}/{sid}").status_code == 409
    overdue = [f.detail for f in report.findings if f.kind is FindingKind.OVERDUE]
    assert closed == reaper_closes
    return overdue


def test_a_reaper_that_stops_closing_sessions_is_found_by_the_probe(monkeypatch):
    (detail,) = overdue_after_two_sweeps(monkeypatch, reaper_closes=False)
    assert "past its 5 s idle timeout" in detail and "the idle timeout never closed it" in detail


def test_the_real_reaper_closes_in_time_and_nothing_is_found(monkeypatch):
    assert overdue_after_two_sweeps(monkeypatch, reaper_closes=True) == []


def test_the_oracle_is_there_only_with_the_probe_and_a_timeout():
    worker = lambda: EngineWorker(Engine())  # noqa: E731
    assert create_app(worker(), ServerSettings(enable_probe=True)).app.state.reaper is None
    plain = create_app(w := worker(), ServerSettings(session_idle_timeout_s=TIMEOUT))
    assert plain.app.state.reaper is not None and w.deadlines is None
