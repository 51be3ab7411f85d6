"""Fuzz the request schema: bodies that mix valid and invalid values for every field.

Each example sends one chat, completion or session request built from
per-field strategies (valid values, wrong types, out-of-range numbers,
unicode with lone surrogates and control characters, empty and long lists,
extra fields, nested junk) to a real engine. Invariants: never a 5xx; an
error is OpenAI-shaped with a code; a success is a well-formed completion,
stream or session. After the run, with leftover sessions closed and the
cache flushed, the probe is clean and every pool is back to its start.
"""

from __future__ import annotations

import json
from typing import NamedTuple
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

from kvwatch.engine import Engine
from kvwatch.server import EngineWorker, ServerSettings, create_app

SESSION_IDS = ("fuzz-a", "fuzz-b")
FINISH = {"stop", "length"}
MAX_TOKENS = 3  # the largest token budget a valid value asks for

# -- values ---------------------------------------------------------------------------------
any_char = st.characters(codec=None, exclude_categories=())  # surrogates and controls too
texts = st.text(any_char, max_size=40)
clean_texts = st.text(max_size=40)  # control characters too, but no lone surrogates
junk = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
not_a_budget = (  # no value here may ask for a long generation
    st.integers(max_value=0)
    | st.integers(min_value=10**5)
    | st.floats(allow_nan=True).filter(lambda f: f != f or f % 1 or abs(f) > 1e5 or f <= 0)
    | st.text(max_size=5).filter(lambda s: not s.strip().isdigit())
    | st.lists(st.integers(), max_size=2)
)  # (null is not here: it asks for the default budget)


class Field(NamedTuple):
    valid: st.SearchStrategy
    invalid: st.SearchStrategy = junk


ROLES = ["system", "user", "assistant", "tool", "developer"]
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(ROLES),
        "content": st.one_of(
            clean_texts,
            st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": clean_texts}), max_size=3
            ),
            st.none(),
        ),
    }
)
bad_message = st.one_of(
    st.fixed_dictionaries({"role": junk, "content": clean_texts}),
    st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": st.one_of(texts, junk)}),
    junk,
)
token_ids = st.lists(st.integers(0, 263), min_size=1, max_size=300)
COMMON = {
    "model": Field(st.text(min_size=1, max_size=20), st.one_of(st.just(""), texts, junk)),
    "max_tokens": Field(st.integers(1, MAX_TOKENS), not_a_budget),
    "temperature": Field(st.floats(0, 2), st.one_of(st.floats(), junk)),
    "top_p": Field(st.floats(0.01, 1), st.one_of(st.floats(), junk)),
    "n": Field(st.just(1), st.one_of(st.integers(), junk)),
    "seed": Field(st.integers(0, 2**63 - 1), st.one_of(st.integers(), junk)),
    "stream": Field(st.booleans()),
    "stream_options": Field(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "stop": Field(st.one_of(st.none(), st.just([])), st.lists(texts, min_size=1, max_size=50)),
    "session_id": Field(
        st.sampled_from(SESSION_IDS), st.one_of(st.just("no-such-session"), texts, junk)
    ),
    "return_routed_experts": Field(st.booleans()),
    "return_token_ids": Field(st.booleans()),
    "ignore_eos": Field(st.booleans()),
}
CHAT_FIELDS = {
    **COMMON,
    "messages": Field(
        st.one_of(
            st.lists(message, min_size=1, max_size=4), st.lists(message, min_size=60, max_size=120)
        ),
        st.one_of(st.just([]), st.lists(bad_message, min_size=1, max_size=3), junk),
    ),
    "max_completion_tokens": Field(st.integers(1, MAX_TOKENS), not_a_budget),
    "logprobs": Field(st.booleans()),
}
TEXT_FIELDS = {
    **COMMON,
    "prompt": Field(
        st.one_of(clean_texts.filter(bool), token_ids),
        st.one_of(st.just(""), st.just([]), texts, st.lists(st.integers(), max_size=5), junk),
    ),
    "logprobs": Field(st.sampled_from([None, 0, 1])),
    "echo": Field(st.just(False)),
}
REQUIRED = {"max_tokens", "model", "messages", "prompt"}  # max_tokens: never the default budget


@st.composite
def body(draw, fields: dict[str, Field]) -> dict:
    """Some fields left out, up to three given invalid values, the rest valid; extra keys."""
    broken = draw(st.sets(st.sampled_from(sorted(fields)), max_size=3))
    out = {}
    for name, f in fields.items():
        if name in REQUIRED or draw(st.booleans()):
            out[name] = draw(f.invalid if name in broken else f.valid)
    if not isinstance(out.get("max_completion_tokens", 1), int) or out.get(
        "max_completion_tokens"
    ) in (0, False):
        out.pop("max_completion_tokens")  # a falsy value would fall back to max_tokens
    extra = draw(st.dictionaries(texts.filter(lambda k: k not in fields), junk, max_size=3))
    return {**extra, **out}


session_path = st.one_of(st.sampled_from(SESSION_IDS), texts.filter(bool)).map(
    lambda s: quote(s.encode("utf-8", "surrogatepass"), safe="")
)
requests = st.one_of(
    st.tuples(st.just("POST"), st.just("/v1/chat/completions"), body(CHAT_FIELDS)),
    st.tuples(st.just("POST"), st.just("/v1/completions"), body(TEXT_FIELDS)),
    st.tuples(
        st.just("POST"),
        st.just("/v1/sessions"),
        st.one_of(
            st.fixed_dictionaries(
                {"session_id": st.one_of(st.none(), texts, junk), "record": st.booleans()},
                optional={"routed_experts": st.one_of(st.booleans(), junk)},
            ),
            junk,
        ),
    ),
    st.tuples(
        st.sampled_from(["GET", "DELETE"]),
        session_path.map(lambda s: f"/v1/sessions/{s}"),
        st.none(),
    ),
    st.tuples(
        st.just("GET"), session_path.map(lambda s: f"/v1/sessions/{s}/trajectory"), st.none()
    ),
    st.tuples(
        st.just("POST"),
        session_path.map(lambda s: f"/v1/sessions/{s}/rollback"),
        st.one_of(st.fixed_dictionaries({"steps": st.one_of(st.integers(1, 2), junk)}), junk),
    ),
)


# -- checks ---------------------------------------------------------------------------------
def check_error(r) -> None:
    assert r.headers["content-type"].startswith("application/json"), r.text
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and isinstance(error["code"], str) and error["code"]
    assert "param" in error


def check_usage(usage: dict) -> None:
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= MAX_TOKENS


def check_completion(path: str, sent: dict, r) -> None:
    chat = path.endswith("chat/completions")
    if sent.get("stream") is True:
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", r.text
        chunks = [json.loads(e) for e in events[:-1]]
        assert all("error" not in c for c in chunks), chunks
        kind = "chat.completion.chunk" if chat else "text_completion"
        assert all(c["object"] == kind for c in chunks)
        ends = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
        assert len(ends) == 1 and ends[0] in FINISH, chunks
        return
    out = r.json()
    assert out["object"] == ("chat.completion" if chat else "text_completion")
    (choice,) = out["choices"]
    assert choice["finish_reason"] in FINISH
    assert isinstance(choice["message"]["content"] if chat else choice["text"], str)
    check_usage(out["usage"])


def check_success(method: str, path: str, sent, r) -> None:
    assert r.headers["content-type"].startswith(("application/json", "text/event-stream"))
    if path.endswith("completions"):
        return check_completion(path, sent, r)
    out = r.json()
    if path.endswith("/trajectory"):
        assert out["object"] == "session.trajectory"
        assert len(out["token_ids"]) == len(out["loss_mask"]) == len(out["logprobs"])
    elif method == "DELETE":
        assert out["closed"] is True
    else:
        assert out["object"] == "session" and out["tokens"] >= 0 and out["turns"] >= 0


# -- the run --------------------------------------------------------------------------------
def usage(engine: Engine) -> dict:
    return {name: (g.free, g.by_owner) for name, g in engine.probe().groups.items()}


@pytest.fixture(scope="module")
def api():
    engine = Engine()
    baseline = usage(engine)
    with TestClient(create_app(EngineWorker(engine), ServerSettings())) as client:
        for sid in SESSION_IDS:
            assert client.post("/v1/sessions", json={"session_id": sid}).status_code == 200
        client.engine, client.statuses = engine, []
        yield client
        worker = client.app.state.worker
        for sid in worker.call(lambda: list(engine.open_sessions())).result(300):
            assert client.delete(f"/v1/sessions/{quote(sid, safe='')}").status_code == 200
        worker.call(engine.flush_cache).result(300)
        report = worker.call(engine.probe).result(300)
        assert report.clean, report.findings
        assert report.live_requests == report.live_sessions == 0 and not engine.request_ids()
        assert worker.call(usage, engine).result(300) == baseline


@seed(20240611)
@settings(
    max_examples=250,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(request=requests)
@example(  # a subnormal temperature once overflowed the sampler's logits to NaN: a 500
    request=(
        "POST",
        "/v1/chat/completions",
        {"model": "0", "max_tokens": 1, "temperature": 5e-324, "messages": [{"role": "user"}]},
    )
)
def test_no_request_body_gets_a_5xx(api, request):
    method, path, sent = request
    data = json.dumps(sent).encode()  # \\u escapes: lone surrogates survive the trip
    r = api.request(method, path, content=data, headers={"content-type": "application/json"})
    api.statuses.append(r.status_code)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        check_error(r)
    else:
        assert r.status_code == 200
        check_success(method, path, sent, r)


def test_the_fuzz_reached_both_outcomes(api):
    """Runs after the fuzz: it sent both requests the server served and ones it refused."""
    assert len(api.statuses) >= 250
    assert sum(s == 200 for s in api.statuses) >= 10, api.statuses
    assert sum(400 <= s < 500 for s in api.statuses) >= 100
