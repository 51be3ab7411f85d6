"""A request still running long after its client hung up is an ``abandoned`` finding.

The oracle watches the connection on its own (``server/clients.py``), so it
holds whichever part of the abort path is lost: here the completion
handlers' own abort on disconnect is planted away, and the request, left to
run to its token limit, is found; with the abort in place nothing is. The
waits bound a hang; they do not judge speed. An abort the server orders
itself (a test control's ``abort_in``) must land within two steps; one lost
inside a step is found the same way.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from inprocserver import serving

from kvwatch.contracts import FindingKind, ProbeReport
from kvwatch.gate.verdicts.detectors import requests
from kvwatch.harness.run_record import RunRecord, Turn
from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings, completions, departures

WAIT_S = 300
BODY = {"model": "t", "prompt": "count on and on", "max_tokens": 600, "ignore_eos": True}


def _hang_up(url: str, stream: bool) -> None:
    """Send a long request and leave once it runs: after two chunks of a stream, or,
    waiting for a whole answer, once the engine has the request."""
    if stream:
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={**BODY, "stream": True}, timeout=WAIT_S
        ) as r:
            chunks = 0
            for line in r.iter_lines():
                chunks += line.startswith("data: ")
                if chunks == 2:
                    return
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(BODY).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as client:
        client.sendall(head + body)
        deadline = time.monotonic() + WAIT_S
        while httpx.get(f"{url}/debug/probe", timeout=WAIT_S).json()["live_requests"] == 0:
            assert time.monotonic() < deadline, "the request never reached the engine"
            time.sleep(0.01)


def _probes_until_idle(url: str) -> list[ProbeReport]:
    probes, deadline = [], time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        probe = ProbeReport.from_json(httpx.get(f"{url}/debug/probe", timeout=WAIT_S).json())
        probes.append(probe)
        if probe.live_requests == 0 and len(probes) > 1:
            return probes
        time.sleep(0.05)
    raise AssertionError("the engine never went idle")


def _verdict(monkeypatch, *, plant: bool, stream: bool):
    if plant:  # the handlers never hand a disconnect to the engine
        monkeypatch.setattr(completions, "_abort_soon", lambda request, s: None)
        # the seconds margin is for a fast engine's steps; 600 steps outlast the step margin
        monkeypatch.setattr(departures, "ABANDON_S", 0.0)
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(enable_probe=True)))
    try:
        with serving(app) as url:
            _hang_up(url, stream)
            probes = _probes_until_idle(url)
    finally:
        telemetry.shutdown()
    return requests.detect(RunRecord(turns=(Turn(turn=0, probes=tuple(probes)),), warmup=0))


@pytest.mark.parametrize("stream", [True, False])
def test_a_request_nobody_aborts_is_found_abandoned(monkeypatch, stream):
    verdict = _verdict(monkeypatch, plant=True, stream=stream)
    assert verdict.failed, verdict
    assert "after its client left" in verdict.evidence[0].detail
    assert verdict.first_turn == 0


@pytest.mark.parametrize("stream", [True, False])
def test_an_aborted_request_is_not(monkeypatch, stream):
    verdict = _verdict(monkeypatch, plant=False, stream=stream)
    assert verdict.verdict != "fail", verdict


def test_the_finding_kind_is_part_of_the_contract():
    assert FindingKind("abandoned") is FindingKind.ABANDONED


# -- an abort the server itself ordered ---------------------------------------------------
def _lost_inside_a_step(self, request_id: str) -> None:
    """The planted bug: an abort handed over inside a step (where the worker passes
    on what arrived during the forward, and the aborts scripted for ``verifying``)
    is dropped before it reaches the engine; between steps it still lands."""
    if not self.engine.in_step and self.engine.abort(request_id):
        self._finish(request_id)


def test_an_ordered_abort_that_never_lands_is_found_abandoned(monkeypatch):
    """A session turn aborted by the test controls at each stage (the clean
    run, every turn aborted and nothing found, is test_combinations'): with the
    planted bug the turn scripted for ``verifying`` runs on to its limit, and
    the oracle names it; every other stage still aborts."""
    from turncuts import cut_turns

    from kvwatch.instrumentation import combos
    from kvwatch.server import EngineWorker

    monkeypatch.setattr(EngineWorker, "abort_now", _lost_inside_a_step)
    _, reasons, abandoned = cut_turns(combos.TURN_STAGES)
    assert reasons["verifying"] == "length"
    assert {r for s, r in reasons.items() if s != "verifying"} == {"abort"}
    assert len(abandoned) == 1 and "after the server aborted it" in abandoned[0], abandoned


def _answers_only_from_scratch(monkeypatch) -> None:
    """The plant: a non-streamed handler that aborts on a disconnect only while its
    request has produced nothing yet (so a hang-up mid-decode is never aborted)."""
    original = completions._next

    async def counting_next(request, stream):
        item = await original(request, stream)
        if item is None and request.scope.get("kvwatch.produced"):
            return await _wait_out(stream)
        request.scope["kvwatch.produced"] = item is not None
        return item

    async def _wait_out(stream):  # read on to the end, as if the client were there
        while not isinstance(item := await stream.queue.get(), completions.Completion):
            pass
        return item

    monkeypatch.setattr(completions, "_next", counting_next)


@pytest.mark.slow  # the lost abort's request runs its 3000 tokens out
def test_a_non_streamed_hang_up_mid_decode_whose_abort_is_lost_is_found(monkeypatch):
    """The real margins (32 steps and 3 s): the request asks for far more tokens than
    a fast engine decodes in 3 s; with the abort in place nothing is found."""
    verdict = _hung_up_mid_decode(monkeypatch, plant=True)
    assert verdict.failed and "after its client left" in verdict.evidence[0].detail, verdict


def test_a_non_streamed_hang_up_mid_decode_is_aborted(monkeypatch):
    assert _hung_up_mid_decode(monkeypatch, plant=False).verdict != "fail"


def _hung_up_mid_decode(monkeypatch, plant: bool):
    if plant:
        _answers_only_from_scratch(monkeypatch)
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(enable_probe=True)))
    try:
        with serving(app) as url:
            host, port = url.removeprefix("http://").split(":")
            body = json.dumps({**BODY, "max_tokens": 3000}).encode()
            head = (
                f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            with socket.create_connection((host, int(port)), timeout=WAIT_S) as client:
                client.sendall(head + body)
                deadline = time.monotonic() + WAIT_S
                start = None
                while True:  # hang up once the request has decoded for a while
                    probe = httpx.get(f"{url}/debug/probe", timeout=WAIT_S).json()
                    if probe["live_requests"] and start is None:
                        start = probe["step"]
                    if start is not None and probe["step"] - start >= 20:
                        break
                    assert time.monotonic() < deadline, "the request never decoded"
                    time.sleep(0.01)
            probes = _probes_until_idle(url)
    finally:
        telemetry.shutdown()
    return requests.detect(RunRecord(turns=(Turn(turn=0, probes=tuple(probes)),), warmup=0))
