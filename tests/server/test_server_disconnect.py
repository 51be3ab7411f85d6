"""A client that goes away aborts its request, mid-prefill, mid-stream or mid-verify, and
leaks nothing.

Where the stage matters (mid-prefill, mid-verify), the engine step of that
stage is held until the server has seen the client leave, so the abort lands
there however fast or slow the machine is. The other cases leave long before
a request of thousands of tokens could finish. Waits have long deadlines:
they bound a hang, they do not judge speed.
"""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest
from inprocserver import metric, serving
from serverproc import TOKEN, kvwatch_server, probe, wait_idle

from kvwatch.engine import EngineConfig, SchedulerConfig, SpecConfig
from kvwatch.serve import ServeOptions, build

pytestmark = pytest.mark.e2e

AUTH = {"Authorization": f"Bearer {TOKEN}"}
STAGES = ("queued", "prefill", "decode")
WAIT_S = 120  # a hang, not a slow machine


@pytest.fixture(scope="module")
def server():
    with kvwatch_server("--enable-probe", "--probe-token", TOKEN) as url:
        yield url


def aborts(url: str, *stages: str) -> float:
    """kvwatch_aborts_total summed over the given abort stages."""
    text = httpx.get(f"{url}/metrics", timeout=300).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kvwatch_aborts_total{")
        and any(f'stage="{stage}"' in line for stage in stages)
    )


def assert_aborted(url: str, stages: tuple[str, ...], before: float) -> None:
    """Wait for the abort counter of ``stages`` to move, then check nothing is left."""
    deadline = time.monotonic() + WAIT_S
    while aborts(url, *stages) == before:
        assert time.monotonic() < deadline, "the disconnect did not abort the request"
        time.sleep(0.05)
    assert_clean_and_empty(url)


def assert_clean_and_empty(url: str) -> None:
    report = wait_idle(url)
    assert report["live_requests"] == 0
    assert report["findings"] == []
    for name, group in report["groups"].items():
        assert group["by_owner"]["request"] == 0, f"{name} still holds request pages"


def test_disconnect_mid_stream_aborts_the_request(server):
    before = aborts(server, "decode")
    body = {
        "model": "t",
        "prompt": "count forever",
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=300) as r:
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data: ")
            if chunks == 2:  # still reading: the request is live
                busy = httpx.post(f"{server}/debug/flush_cache", headers=AUTH, timeout=300)
                assert busy.status_code == 409 and busy.json()["error"]["code"] == "engine_busy"
            if chunks >= 3:
                break  # leaving the iteration closes the connection
    assert_aborted(server, ("decode",), before)


def test_a_flush_is_refused_while_a_request_is_paused(server):
    """A request held by the test controls is paused: it has no work for the engine
    (nothing steps), yet it is live and comes back for its prefix, so a flush
    answers 409. Its hold (a minute) bounds a hang, not the machine's speed; the
    client then hangs up, and once the abort leaves the engine idle a flush goes
    through."""
    body = {
        "model": "t",
        "prompt": "hold this for a while",
        "max_tokens": 4,
        "ignore_eos": True,
        "stream": True,
        "kvwatch": {"pause_after_output": 1, "hold_s": 60},
    }
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=WAIT_S) as r:
        lines = r.iter_lines()  # left open while the flush is tried: leaving it hangs up
        while not next(lines).startswith("data: "):  # the first token is out: it pauses
            pass
        deadline = time.monotonic() + WAIT_S
        while not probe(server)["queue"]["paused"]:
            assert time.monotonic() < deadline, "the request never paused"
            time.sleep(0.02)
        busy = httpx.post(f"{server}/debug/flush_cache", headers=AUTH, timeout=WAIT_S)
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "engine_busy"
        lines.close()
    assert_clean_and_empty(server)  # the hang-up aborted it
    assert httpx.post(f"{server}/debug/flush_cache", headers=AUTH, timeout=WAIT_S).is_success


def test_non_streaming_disconnect_aborts_too(server):
    before = aborts(server, *STAGES)
    body = {"model": "t", "prompt": "x", "max_tokens": 3000, "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server}/v1/completions", json=body, timeout=1.0)
    assert_aborted(server, STAGES, before)


# -- speculative decoding on, served in this process so a step can be held --------------
REPETITIVE = "abcabcabcabcabcabc " * 4  # the n-gram proposer finds drafts in it
ABORTS = "kvwatch_aborts_total"


@pytest.fixture(scope="module")
def spec_server():
    config = EngineConfig(scheduler=SchedulerConfig(spec=SpecConfig(num_drafts=4)))
    app, worker, telemetry = build(ServeOptions(), config)
    try:
        with serving(app) as url:
            yield url, worker
    finally:
        telemetry.shutdown()


def assert_left_nothing(worker) -> None:
    """Once idle: a clean probe, no live request, no request pages, nothing untaken."""
    engine, deadline = worker.engine, time.monotonic() + WAIT_S
    while (report := worker.call(engine.probe).result(300)).live_requests:
        assert time.monotonic() < deadline, "requests are still live"
        time.sleep(0.05)
    assert report.clean, report.findings
    for name, group in report.groups.items():
        assert group.by_owner["request"] == 0, f"{name} still holds request pages"
    assert worker.call(engine.request_ids).result(300) == ()


def wait_for(url: str, before: float, moved: int, **labels: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while metric(url, ABORTS, **labels) < before + moved:
        assert time.monotonic() < deadline, f"aborts{labels} did not move by {moved}"
        time.sleep(0.05)
    assert metric(url, ABORTS, **labels) == before + moved


def hold_until_the_client_leaves(
    worker, monkeypatch, holds
) -> tuple[threading.Event, threading.Event]:
    """Hold the first engine batch that ``holds(works)`` picks until the server has
    handed the client's disconnect to the worker (``abort_soon``), so the abort
    lands at the engine's safe point inside that very step. Returns the events
    (held, abort seen)."""
    held, abort_seen = threading.Event(), threading.Event()
    run, abort_soon = worker.engine._runner.run, worker.abort_soon

    def held_run(works):
        if not held.is_set() and holds(works):
            held.set()
            abort_seen.wait(WAIT_S)
        return run(works)

    def seen_abort_soon(request_id: str) -> None:
        abort_soon(request_id)
        abort_seen.set()

    monkeypatch.setattr(worker.engine._runner, "run", held_run)
    monkeypatch.setattr(worker, "abort_soon", seen_abort_soon)
    return held, abort_seen


def leave_while_held(url: str, body: dict, held: threading.Event, abort_seen) -> None:
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=300
    ) as r:
        assert r.status_code == 200
        assert held.wait(WAIT_S), "the step to hold never ran"
    assert abort_seen.wait(WAIT_S), "the server did not notice the disconnect"


def test_disconnect_mid_prefill_aborts_the_request(spec_server, monkeypatch):
    """A prefill chunk that does not reach the prompt's end is held."""
    url, worker = spec_server
    held = hold_until_the_client_leaves(
        worker, monkeypatch, lambda works: any(w.start + w.n < len(w.request.tokens) for w in works)
    )
    before = metric(url, ABORTS, stage="prefill")
    body = {"model": "t", "prompt": [65 + i % 26 for i in range(3500)], "max_tokens": 4}
    leave_while_held(url, body, *held)
    wait_for(url, before, 1, stage="prefill")
    assert_left_nothing(worker)


def test_disconnect_mid_verify_aborts_the_request(spec_server, monkeypatch):
    """The first verify step (a batch with drafts) is held."""
    url, worker = spec_server
    held = hold_until_the_client_leaves(
        worker, monkeypatch, lambda works: any(w.drafts for w in works)
    )
    before = metric(url, ABORTS, stage="verify")
    body = {"model": "t", "prompt": REPETITIVE, "max_tokens": 500, "ignore_eos": True}
    body["temperature"] = 0  # speculation serves greedy requests only
    leave_while_held(url, body, *held)
    wait_for(url, before, 1, stage="verify")
    assert_left_nothing(worker)


def test_disconnects_at_random_points_abort_every_request_and_leave_nothing(spec_server):
    url, worker = spec_server
    rng = random.Random(20240611)
    long_prompt = [65 + i % 26 for i in range(3500)]  # 55 prefill chunks
    before = metric(url, ABORTS)
    for _ in range(8):
        prompt = rng.choice([REPETITIVE, long_prompt, "count on and on"])
        body = {"model": "t", "prompt": prompt, "max_tokens": 500, "ignore_eos": True}
        body["temperature"] = rng.choice([0, 0, 0.7])
        if rng.random() < 0.25:  # not streaming: the client gives up waiting
            with pytest.raises(httpx.TimeoutException):
                httpx.post(f"{url}/v1/completions", json=body, timeout=rng.uniform(0.05, 0.5))
            continue
        lines = rng.randint(0, 5)  # 0: gone as soon as the response starts
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=300
        ) as r:
            assert r.status_code == 200
            for n, _line in enumerate(r.iter_lines() if lines else ()):
                if n >= lines:
                    break
    wait_for(url, before, 8)
    assert_left_nothing(worker)
