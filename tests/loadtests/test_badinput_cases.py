"""The bad-input profile's cases, judged as an OpenAI-compatible server must answer.

Each case names the served model, so a server refuses it for what is wrong
with it, not for the model's name. Cases that are valid OpenAI requests may be
answered; kvwatch's session cases go to kvwatch servers only.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from kvwatch.engine import Engine
from kvwatch.loadtests.badcases import CASES, Case, body_of, cases_for, context_of, judge
from kvwatch.server import EngineWorker, ServerSettings, create_app

OPENAI_ERROR = json.dumps({"error": {"message": "no", "type": "invalid_request_error"}})
NOT_FOUND = json.dumps({"detail": "Not Found"})
BY_NAME = {c.name: c for c in CASES}


def test_an_invalid_request_must_be_refused_with_an_openai_error():
    case = BY_NAME["negative max_tokens"]
    assert judge(case, "vllm", 400, OPENAI_ERROR) is None
    assert "want a 4xx, got 200" in judge(case, "vllm", 200, "{}")
    assert "want a 4xx, got 500" in judge(case, "vllm", 500, OPENAI_ERROR)
    assert "not an OpenAI-style error body" in judge(case, "vllm", 404, NOT_FOUND)


def test_a_valid_request_may_be_answered_or_refused_cleanly():
    case = BY_NAME["n > 1"]
    assert judge(case, "sglang", 200, "{}") is None
    assert judge(case, "kvwatch", 400, OPENAI_ERROR) is None
    assert judge(case, "kvwatch", 400, "bad") is not None


def test_a_request_that_fills_the_context_exactly_must_be_served():
    case = BY_NAME["prompt and max_tokens fill the context"]
    body = json.loads(body_of(case, "tiny", lambda: 300))
    assert len(body["prompt"]) + body["max_tokens"] == 300
    assert judge(case, "sglang", 200, "{}") is None
    too_long = json.dumps(
        {"error": {"message": "the context holds 300", "type": "invalid_request_error",
                   "code": "context_length_exceeded"}}
    )  # fmt: skip
    assert "refused as too long" in judge(case, "kvwatch", 400, too_long)
    assert judge(case, "kvwatch", 400, OPENAI_ERROR) is None  # refused for another reason
    unsaid = json.loads(body_of(case, "tiny", lambda: context_of(lambda: {}, "tiny")))
    assert len(unsaid["prompt"]) == 8  # a server that does not say its context: nothing to fill


def test_an_engine_known_to_accept_an_invalid_request_may_answer_it():
    case = BY_NAME["temperature too high"]
    assert judge(case, "vllm", 200, "{}") is None
    assert judge(case, "kvwatch", 200, "{}") is not None


def test_session_cases_go_to_kvwatch_servers_only():
    sessions = {c.name for c in CASES if c.sessions}
    assert sessions == {"unknown session", "malformed session id", "rollback unknown session"}
    assert {c.name for c in cases_for("vllm")} == set(BY_NAME) - sessions
    assert cases_for("kvwatch") == CASES


def test_the_served_context_comes_from_the_model_card():
    cards = {"data": [{"id": "other", "max_model_len": 9}, {"id": "tiny", "max_model_len": 2048}]}
    assert context_of(lambda: cards, "tiny") == 2048
    assert context_of(lambda: cards, "unknown") == 9  # the first card
    assert context_of(lambda: {"data": []}, "tiny") > 100_000  # not said: assume a long one


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_case_is_judged_right_on_the_kvwatch_server(case: Case):
    settings = ServerSettings(model_name="tiny")
    with TestClient(create_app(EngineWorker(Engine()), settings)) as client:
        data = body_of(case, "tiny", lambda: context_of(client.get("/v1/models").json, "tiny"))
        resp = client.post(case.path, content=data, headers={"content-type": "application/json"})
        assert judge(case, "kvwatch", resp.status_code, resp.text) is None, resp.text
        if case.required:
            assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4
        else:
            assert 400 <= resp.status_code < 500  # kvwatch supports none of the valid extras
