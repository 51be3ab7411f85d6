"""Faults the server survives: a request that raises, a request no pool can hold, pool
pressure, and session calls with every injected fault switched on.

Each fault is real: a function on the request's own code path raises, the
pool is genuinely too small, the registry's fault is switched on. After each,
the other requests were served and the probe says what it should.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from conversations import small_cache
from fastapi.testclient import TestClient
from sessionsim import abort_mid_verify

from kvwatch.engine import Engine, EngineConfig, Fault, SchedulerConfig, SpecConfig
from kvwatch.engine.events import RequestFailed, RequestRetracted
from kvwatch.server import EngineWorker, ServerSettings, create_app

CHAT, TEXT, SESSIONS = "/v1/chat/completions", "/v1/completions", "/v1/sessions"
POISON_SEED = 666


def serve(config: EngineConfig | None = None) -> TestClient:
    engine = Engine(config)
    client = TestClient(create_app(EngineWorker(engine), ServerSettings()))
    client.engine = engine
    return client


def on_worker(client: TestClient, fn, *args):
    return client.app.state.worker.call(fn, *args).result(300)


def assert_drained_and_clean(client: TestClient) -> None:
    report = on_worker(client, client.engine.probe)
    assert report.clean, report.findings
    assert report.live_requests == 0 and not client.engine.request_ids()
    assert all(g.by_owner["request"] == 0 for g in report.groups.values()), report.groups


def text(prompt: str, **kw) -> dict:
    return {"model": "t", "prompt": prompt, "max_tokens": 12, "ignore_eos": True, **kw}


def test_an_exception_in_one_requests_sampling_fails_it_alone(monkeypatch):
    """The sampler raises for one request mid-decode, inside a batch of four: that one gets
    a 500 in OpenAI's shape, streamed or not; the others finish with the tokens a clean
    run gives them."""
    client = serve()
    with client:
        want = client.post(TEXT, json=text("tell me more", temperature=0)).json()
        sample = client.engine._runner._sample

        def poisoned(req, logits):
            if req.params.seed == POISON_SEED and len(req.output_ids) >= 3:
                raise RuntimeError("the sampler broke on this request")
            return sample(req, logits)

        monkeypatch.setattr(client.engine._runner, "_sample", poisoned)
        bodies = [
            text("tell me more", temperature=0),
            text("poison", temperature=0.5, seed=POISON_SEED),
            text("poison", temperature=0.5, seed=POISON_SEED, stream=True),
            text("tell me more", temperature=0),
        ]
        with ThreadPoolExecutor(len(bodies)) as pool:
            good, bad, bad_stream, good_too = pool.map(lambda b: client.post(TEXT, json=b), bodies)
        for r in (good, good_too):
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == want["choices"][0]["text"]
        assert bad.status_code == 500
        error = bad.json()["error"]
        assert error["code"] == "internal_error" and "sampler broke" in error["message"]
        events = [line[6:] for line in bad_stream.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "internal_error"
        assert client.post(TEXT, json=text("and now?")).status_code == 200
        assert_drained_and_clean(client)


def test_a_request_larger_than_a_whole_pool_gets_a_4xx_and_the_rest_is_served():
    client = serve(EngineConfig(cache=small_cache(full=8)))  # 8 pages: 128 tokens
    failed: list[RequestFailed] = []
    client.engine.events.subscribe(RequestFailed, failed.append)
    with client:
        r = client.post(TEXT, json=text("x" * 300))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "request_failed" and "pages" in error["message"], error
        assert client.post(TEXT, json=text("a short one")).status_code == 200
        assert len(failed) == 1
        assert_drained_and_clean(client)


def test_pool_pressure_retracts_requests_and_every_one_is_served():
    """Four requests of 14 pages each on a 24-page pool: some step back and resume."""
    client = serve(EngineConfig(cache=small_cache(full=24)))
    retracted: list[RequestRetracted] = []
    client.engine.events.subscribe(RequestRetracted, retracted.append)
    with client:
        bodies = [text(f"{i}" * 150, max_tokens=60, temperature=0) for i in range(4)]
        with ThreadPoolExecutor(len(bodies)) as pool:
            replies = list(pool.map(lambda b: client.post(TEXT, json=b), bodies))
        assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
        assert all(r.json()["usage"]["completion_tokens"] == 60 for r in replies)
        assert retracted, "the pool was never under pressure"
        assert_drained_and_clean(client)


SESSION_FAULTS = [
    Fault.SESSION_TAIL_UNALIGNED_FREE,
    Fault.SESSION_TAIL_LEAK,
    Fault.SPEC_OVERALLOC_LEAK,
    Fault.ABORT_STATE_BUFFER_LEAK,
    Fault.SESSION_BLOB_RETENTION,
    Fault.INTERIOR_SNAPSHOT_LEAK,
]


@pytest.mark.parametrize("fault", SESSION_FAULTS, ids=str)
def test_session_calls_never_answer_5xx_with_a_fault_on(fault):
    """Turns cut mid-verify leave speculative gaps, which the session faults mishandle;
    every session call still answers 2xx or a clear 4xx, and the server goes on serving.
    With the unaligned free the probe still reports the damage: closing does not hide it."""
    config = EngineConfig(
        cache=small_cache(full=512),
        scheduler=SchedulerConfig(chunk_size=16, spec=SpecConfig(num_drafts=4)),
        faults=frozenset({fault}),
    )
    client = serve(config)
    client.engine.on_batch_computed(abort_mid_verify(client.engine, 2))
    statuses = []
    with client:
        sids = [client.post(SESSIONS, json={"record": True}).json()["id"] for _ in range(2)]
        for turn in range(3):
            for sid in sids:
                body = {
                    "model": "t",
                    "session_id": sid,
                    "messages": [{"role": "user", "content": f"abcabcabc {turn} abcabc"}],
                    "max_tokens": 24,
                    "temperature": 0,
                }
                statuses.append(client.post(CHAT, json=body).status_code)
        for sid in sids:
            statuses.append(client.get(f"{SESSIONS}/{sid}").status_code)
            statuses.append(client.get(f"{SESSIONS}/{sid}/trajectory").status_code)
            statuses.append(client.post(f"{SESSIONS}/{sid}/rollback", json={}).status_code)
            close = client.delete(f"{SESSIONS}/{sid}")
            assert close.status_code == 200, close.text
        assert all(s < 500 for s in statuses), statuses
        assert client.post(TEXT, json=text("still serving")).status_code == 200
        report = on_worker(client, client.engine.probe)
        assert report.live_sessions == 0 and report.live_requests == 0
        if fault is Fault.SESSION_TAIL_UNALIGNED_FREE:
            assert not report.clean, "the fault's damage should stay visible to the probe"
