"""The server's leak-test aids: scripted retraction through a request's ``kvwatch``
controls, and per-step watching (``/debug/watch``, ``/debug/latched``).

Both are real: the retraction goes through the scheduler's own retract path (the
engine publishes ``RequestRetracted`` and later ``RequestRecovered``), and the
latched probes are the engine's own probe reports taken between steps.
"""

from __future__ import annotations

from fastapi.testclient import TestClient

from kvwatch.contracts import FindingKind, ProbeReport
from kvwatch.engine import Engine, EngineConfig, Fault
from kvwatch.engine.events import RequestRecovered, RequestRetracted
from kvwatch.server import EngineWorker, ServerSettings, create_app

TEXT = "/v1/completions"
PROMPT = "the quick brown fox jumps over the lazy dog " * 8  # about 360 byte tokens


def serve(*, probe: bool, faults: frozenset[Fault] = frozenset()) -> TestClient:
    engine = Engine(EngineConfig(faults=faults))
    settings = ServerSettings(enable_probe=probe)
    client = TestClient(create_app(EngineWorker(engine), settings))
    client.engine = engine
    return client


def body(**kw) -> dict:
    return {"model": "t", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, **kw}


def test_test_controls_are_refused_without_the_probe_flag():
    client = serve(probe=False)
    with client:
        r = client.post(TEXT, json=body(kvwatch={"retract_after": 16}))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "test_controls_disabled" and error["param"] == "kvwatch"
        assert client.post(TEXT, json=body()).status_code == 200  # the server is fine


def test_bad_test_controls_get_a_400():
    client = serve(probe=True)
    with client:
        for controls in ({"retract_after": 0}, {"hold_steps": -1}, {"retract_after": "x"}):
            r = client.post(TEXT, json=body(kvwatch=controls))
            assert r.status_code == 400, (controls, r.text)
            assert r.json()["error"]["type"] == "invalid_request_error"


def test_a_scripted_retraction_pushes_the_request_out_and_it_finishes_the_same():
    """The request is retracted once it computed 64 tokens past its cached prefix,
    recovers after its hold, and answers what an undisturbed request answers; the
    engine ends clean."""
    client = serve(probe=True)
    retracted, recovered = [], []
    client.engine.events.subscribe(RequestRetracted, retracted.append)
    client.engine.events.subscribe(RequestRecovered, recovered.append)
    with client:
        want = client.post(TEXT, json=body()).json()["choices"][0]["text"]
        client.post("/debug/flush_cache").raise_for_status()
        controls = {"retract_after": 64, "hold_steps": 4}
        r = client.post(TEXT, json=body(kvwatch=controls))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want
        assert len(retracted) == 1 and retracted[0].computed_tokens >= 64
        assert [e.request_id for e in recovered] == [retracted[0].request_id]
        report = ProbeReport.from_json(client.get("/debug/probe").json())
        assert report.clean, report.findings
        assert report.live_requests == 0


def test_watching_latches_a_finding_once_where_it_began():
    """With a root ref leaked on every miss, the finding shows after the first step
    and stays (growing): the watcher keeps one probe for it, not one per step. A clean engine
    under the same load latches nothing."""
    for faults, want_latched in (
        (frozenset({Fault.ROOT_REF_LEAK_ON_MISS}), True),
        (frozenset(), False),
    ):
        client = serve(probe=True, faults=faults)
        with client:
            assert client.post("/debug/watch?on=true").json() == {"watching": True}
            for i in range(3):
                r = client.post(TEXT, json=body(prompt=f"{i} {PROMPT}"))
                assert r.status_code == 200, r.text
            got = client.get("/debug/latched").json()
            probes = [ProbeReport.from_json(p) for p in got["probes"]]
            assert got["dropped"] == 0
            if not want_latched:
                assert probes == []
                continue
            assert len(probes) == 1, [p.findings for p in probes]
            assert [f.kind for f in probes[0].findings] == [FindingKind.REF_MISMATCH]
            assert client.get("/debug/latched").json()["probes"] == []  # handed over once
