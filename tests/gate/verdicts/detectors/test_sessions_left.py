"""Every session the load opened is closed once the run has drained.

The users open their sessions before the baseline is taken, so the count of
live sessions after the drain, compared with the baseline, cannot see one
left open: these tests plant exactly that (a close the server answers 200
but never carries out, for one session in two) and check that the recorder
names the session and the allocator's drain rule fails on it, and that the
same traffic without the plant passes.
"""

from __future__ import annotations

import httpx
import pytest
import requests
from inprocserver import serving

from kvwatch.engine.engine import Engine
from kvwatch.gate.verdicts.detectors import allocator
from kvwatch.harness.recorder import TurnRecorder
from kvwatch.harness.sources import HttpSource
from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings

CHAT = {"model": "t", "max_tokens": 3}


def _run(monkeypatch, *, plant: bool):
    if plant:  # the second session's close is answered but never carried out
        original = Engine.close_session

        def close(self, session_id, **kwargs):
            if not session_id.endswith("-1"):
                original(self, session_id, **kwargs)

        monkeypatch.setattr(Engine, "close_session", close)
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(enable_probe=True)))
    try:
        with serving(app) as url, httpx.Client(base_url=url, timeout=120) as http:
            opened = [
                http.post("/v1/sessions", json={"session_id": f"s-{i}"}).json()["id"]
                for i in range(2)
            ]
            recorder = TurnRecorder(HttpSource(url, white_box=True))
            recorder.start()  # the baseline holds both sessions, as in a gate run
            for sid in opened:
                messages = [{"role": "user", "content": f"hello from {sid}"}]
                resp = http.post(
                    "/v1/chat/completions", json={**CHAT, "messages": messages, "session_id": sid}
                )
                assert resp.status_code == 200, resp.text
            recorder.barrier(0, [{"conversations": 2}])
            for sid in opened:
                assert http.delete(f"/v1/sessions/{sid}").status_code == 200
            recorder.finish([{"sessions": opened}])
    finally:
        telemetry.shutdown()
    return recorder.record()


def test_a_session_left_open_fails_the_drain_rule(monkeypatch):
    record = _run(monkeypatch, plant=True)
    assert record.sessions_left == ("s-1",) and record.sessions_opened == 2
    # the live count alone passes: one session live after the drain, two before
    assert record.drained.live_sessions <= record.baseline.live_sessions
    verdict = allocator.detect(record)
    assert verdict.failed and verdict.after_drain
    assert any("session s-1, which the load opened" in e.detail for e in verdict.evidence)


def test_every_session_closed_passes(monkeypatch):
    record = _run(monkeypatch, plant=False)
    assert record.sessions_left == () and record.sessions_opened == 2
    assert not allocator.detect(record).failed


@pytest.mark.parametrize("status, open_", [(200, True), (409, False), (404, False)])
def test_the_http_source_asks_the_sessions_api(status, open_):
    answer = requests.Response()
    answer.status_code = status
    source = HttpSource("http://target", white_box=True)
    source.http.get = lambda url, timeout: answer
    assert source.session_open("s-0") is open_
    assert HttpSource("http://target", white_box=False).session_open("s-0") is False
