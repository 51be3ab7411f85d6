"""A client that goes away aborts its request, mid-prefill or mid-stream, and leaks nothing."""

from __future__ import annotations

import time

import httpx
import pytest
from serverproc import TOKEN, kvwatch_server, probe, wait_idle

AUTH = {"Authorization": f"Bearer {TOKEN}"}
STAGES = ("queued", "prefill", "decode")


@pytest.fixture(scope="module")
def server():
    with kvwatch_server("--enable-probe", "--probe-token", TOKEN) as url:
        yield url


def aborts(url: str, *stages: str) -> float:
    """kvwatch_aborts_total summed over the given abort stages."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kvwatch_aborts_total{")
        and any(f'stage="{stage}"' in line for stage in stages)
    )


def assert_aborted(url: str, stages: tuple[str, ...], before: float) -> None:
    """Wait for the abort counter of ``stages`` to move, then check nothing is left."""
    deadline = time.monotonic() + 30
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


def test_disconnect_mid_prefill_aborts_the_request(server):
    before = aborts(server, "prefill")
    body = {
        "model": "t",
        "prompt": [65 + i % 26 for i in range(3500)],
        "max_tokens": 4,
        "stream": True,
    }
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        deadline = time.monotonic() + 30
        while probe(server)["queue"]["running"] == 0:  # admitted: its prefill has started
            assert time.monotonic() < deadline
            time.sleep(0.01)
    # leaving the block closed the connection long before 3500 tokens were prefilled
    assert_aborted(server, ("prefill",), before)


def test_disconnect_mid_stream_aborts_the_request(server):
    before = aborts(server, "decode")
    body = {
        "model": "t",
        "prompt": "count forever",
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as r:
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data: ")
            if chunks == 2:  # still reading: the request is live
                busy = httpx.post(f"{server}/debug/flush_cache", headers=AUTH, timeout=30)
                assert busy.status_code == 409 and busy.json()["error"]["code"] == "engine_busy"
            if chunks >= 3:
                break  # leaving the iteration closes the connection
    assert_aborted(server, ("decode",), before)


def test_non_streaming_disconnect_aborts_too(server):
    before = aborts(server, *STAGES)
    body = {"model": "t", "prompt": "x", "max_tokens": 3000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/v1/completions", json=body, timeout=1.0)
    assert_aborted(server, STAGES, before)
