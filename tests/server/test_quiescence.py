"""The quiescence oracle: registries found by walking, and a run that leaves
anything behind fails, whatever the bug is called.

The live tests plant two leaks no fault in the registry describes (a session
clock that never forgets a closed session, an engine that keeps every
request it hands out) and check that the detector names the container that
keeps them, and passes on the same traffic without the plant.
"""

from __future__ import annotations

from collections import Counter, deque
from types import MappingProxyType

import httpx
import pytest
from inprocserver import serving
from probes import make_probe

from kvwatch.engine.engine import Engine
from kvwatch.gate.verdicts.detectors import quiescence
from kvwatch.harness.run_record import RunRecord, Turn
from kvwatch.instrumentation.registries import module_roots, registry_sizes, walk
from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings
from kvwatch.server.idle import SessionClock


class _Listener:
    def __init__(self) -> None:
        self.open: dict[str, int] = {}

    def on_event(self, event) -> None:
        self.open[event] = 1


class _Holder:
    __bounded__ = MappingProxyType({"recent": 4})

    def __init__(self, listener: _Listener) -> None:
        self.table: dict[str, int] = {"a": 1}
        self.queue: list[int] = [1, 2, 3]
        self.recent: list[int] = [1, 2]
        self.counts: Counter = Counter({"x": 2, "y": 0, "z": -1})
        self.subscribers = {"evt": [listener.on_event]}
        self.nested = self  # cycles are walked once


# classes defined in a test module are not kvwatch's own: pretend they are
_Holder.__module__ = _Listener.__module__ = "kvwatch.fake"


def test_walk_names_containers_by_path_and_follows_subscribers():
    listener = _Listener()
    listener.open.update(a=1, b=2)
    sizes = registry_sizes({"app": _Holder(listener)})
    assert sizes["app.table"] == 1 and sizes["app.queue"] == 3
    assert "app.recent" not in sizes  # declared bounded
    assert sizes["app.counts"] == 2  # a Counter counts what it counts
    assert sizes["app.subscribers"] == 1 and sizes["app.subscribers[*]"] == 1
    assert sizes["app.subscribers~_Listener.open"] == 2  # reached through its bound method


def test_a_declared_bound_is_checked_not_trusted():
    """Bounded containers are not compared before and after a run, but one that
    holds more than its class declares, or a deque that could, is a breach."""
    holder = _Holder(_Listener())
    assert walk({"app": holder}).breaches == ()
    holder.recent.extend(range(10))  # a bug that keeps an entry per request here
    (breach,) = walk({"app": holder}).breaches
    assert (breach.path, breach.size, breach.bound) == ("app.recent", 12, 4)
    assert "above the 4 its class declares" in breach.detail
    holder.recent = deque([1], maxlen=None)  # bounded by name only: it would grow
    (breach,) = walk({"app": holder}).breaches
    assert "keeps any number" in breach.detail
    holder.recent = deque([1], maxlen=4)
    assert walk({"app": holder}).breaches == ()


def test_a_breach_is_a_registry_finding_quiescence_fails_on(monkeypatch):
    """Live: a server whose finished-request log lost its bound (a plain list,
    unread) reports a registry finding, and quiescence fails on it."""
    from kvwatch.server import finished

    monkeypatch.setattr(finished, "MAX_KEPT", 2)
    monkeypatch.setattr(finished.FinishedLog, "__bounded__", MappingProxyType({"_kept": 2}))
    original = finished.FinishedLog.__init__

    def unbounded(self, *args) -> None:
        original(self, *args)
        self._kept = deque()  # the plant: the deque keeps every entry

    monkeypatch.setattr(finished.FinishedLog, "__init__", unbounded)
    verdict = _verdict()
    assert verdict.failed, verdict
    assert any(
        "keeps any number" in e.detail or "above the 2" in e.detail for e in verdict.evidence
    )


def test_module_globals_are_roots():
    roots = module_roots()
    assert "kvwatch.engine.faults.REGISTRY" in roots
    assert all(name.startswith("kvwatch.") for name in roots)


def _run(before, after) -> RunRecord:
    return RunRecord(
        turns=(Turn(turn=0, probes=(before,), conversations=1, context_tokens=10),),
        warmup=0,
        baseline=before,
        drained=after,
    )


def test_detector_fails_on_what_is_left_and_passes_when_back_or_lower():
    base = make_probe()._replace(registries={"worker._streams": 0, "engine.requests": 2})
    same = base._replace(registries={"worker._streams": 0, "engine.requests": 1})
    assert quiescence.detect(_run(base, same)).verdict == "pass"
    left = base._replace(registries={"worker._streams": 3, "engine.requests": 2, "new.map": 4})
    verdict = quiescence.detect(_run(base, left))
    assert verdict.failed and verdict.first_turn == 1
    details = [e.detail for e in verdict.evidence]
    assert details == [
        "new.map holds 4 entries after the run, 0 before",
        "worker._streams holds 3 entries after the run, 0 before",
    ]
    refs = make_probe(root=(3, 0))._replace(registries=base.registries)
    assert "root holds 3 refs" in quiescence.detect(_run(base, refs)).evidence[0].detail


def test_detector_fails_on_host_tier_pages_left():
    base = make_probe()
    group = base.groups["swa.window"]
    host = {**base.groups, "swa.window": group._replace(by_owner={**group.by_owner, "host": 2})}
    after = base._replace(stats=base.stats._replace(groups=host))
    verdict = quiescence.detect(_run(base, after))
    assert verdict.failed and verdict.evidence[0].group == "swa.window"


def _traffic(url: str) -> None:
    """Sessions and stateless chats, every session closed, then a flush."""
    with httpx.Client(base_url=url, timeout=120) as http:
        for i in range(3):
            sid = http.post("/v1/sessions", json={}).json()["id"]
            for text in ("hello there", "and again"):
                resp = http.post(
                    "/v1/chat/completions",
                    json={
                        "model": "kvwatch-tiny-hybrid",
                        "messages": [{"role": "user", "content": f"{text} {i}"}],
                        "max_tokens": 3,
                        "session_id": sid,
                    },
                )
                assert resp.status_code == 200, resp.text
            assert http.delete(f"/v1/sessions/{sid}").status_code == 200
            resp = http.post(
                "/v1/chat/completions",
                json={
                    "model": "kvwatch-tiny-hybrid",
                    "messages": [{"role": "user", "content": f"stateless {i}"}],
                    "max_tokens": 2,
                },
            )
            assert resp.status_code == 200, resp.text
        assert http.post("/debug/flush_cache").status_code == 200


def _verdict() -> quiescence.Verdict:
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(enable_probe=True)))
    try:
        with serving(app) as url:
            from kvwatch.contracts import ProbeReport

            before = ProbeReport.from_json(httpx.get(f"{url}/debug/probe", timeout=120).json())
            _traffic(url)
            after = ProbeReport.from_json(httpx.get(f"{url}/debug/probe", timeout=120).json())
    finally:
        telemetry.shutdown()
    return quiescence.detect(_run(before, after))


def test_clean_server_comes_back():
    verdict = _verdict()
    assert verdict.verdict == "pass", verdict


@pytest.mark.parametrize(
    "plant, container",
    [
        ("clock", "clock._last holds 3 entries"),
        ("requests", "worker.engine._requests holds"),
    ],
)
def test_planted_leaks_are_named(monkeypatch, plant, container):
    if plant == "clock":  # a closed session is never forgotten
        monkeypatch.setattr(SessionClock, "forget", lambda self, session_id: None)
    else:  # a request is handed out but never dropped from the table
        original = Engine.take

        def take(self, request_id):
            req = self._requests[request_id]
            out = original(self, request_id)
            self._requests[request_id] = req
            return out

        monkeypatch.setattr(Engine, "take", take)
    verdict = _verdict()
    assert verdict.failed, verdict
    assert any(container in e.detail for e in verdict.evidence), verdict.evidence
