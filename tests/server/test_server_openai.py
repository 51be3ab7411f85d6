"""``kvwatch serve`` in a subprocess, driven by the official ``openai`` client."""

from __future__ import annotations

import httpx
import openai
import pytest
from serverproc import TOKEN, kvwatch_server, probe, wait_idle

from kvwatch.instrumentation import names

pytestmark = pytest.mark.e2e

SYSTEM = "You are the storage agent. Answer with the pool that holds the data. " * 3
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server():
    with kvwatch_server("--enable-probe", "--probe-token", TOKEN) as url:
        yield url


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def chat(*user: str):
    return [{"role": "system", "content": SYSTEM}, *({"role": "user", "content": u} for u in user)]


def test_chat_non_streaming_reports_usage_and_cached_tokens(client, server):
    first = client.chat.completions.create(
        model="tiny", messages=chat("Where is the window?"), max_tokens=8, temperature=0
    )
    assert first.object == "chat.completion"
    assert first.choices[0].finish_reason in ("stop", "length")
    assert first.usage.completion_tokens >= 1
    assert first.usage.prompt_tokens == len(SYSTEM) + len("Where is the window?") + 6
    # The next turn repeats the conversation: its state is recovered from the
    # snapshot the first turn left at its last page boundary. (Greedy output
    # here is ASCII, so the text re-encodes to the very tokens generated.)
    history = [
        *chat("Where is the window?"),
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And the state?"},
    ]
    again = client.chat.completions.create(
        model="tiny", messages=history, max_tokens=8, temperature=0
    )
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16
    assert wait_idle(server)["findings"] == []


def test_chat_streaming_yields_the_same_text_as_non_streaming(client):
    kwargs = dict(model="tiny", messages=chat("Stream it."), max_tokens=12, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_streaming_and_not_with_token_id_prompts(client):
    done = client.completions.create(
        model="tiny", prompt=[72, 105, 33] * 10, max_tokens=6, temperature=0
    )
    assert done.object == "text_completion" and done.usage.prompt_tokens == 30
    stream = client.completions.create(
        model="tiny", prompt=[72, 105, 33] * 10, max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == done.choices[0].text


def test_routed_experts_and_logprobs_come_back_when_asked(server):
    body = {
        "model": "tiny",
        "prompt": "abcdefgh",
        "max_tokens": 4,
        "temperature": 0,
        "return_routed_experts": True,
        "logprobs": 1,
    }
    out = httpx.post(f"{server}/v1/completions", json=body, timeout=300).json()
    experts = out["routed_experts"]
    assert len(experts) == 8 + 4 - 1  # every computed token: prompt + outputs but the last
    assert all(len(layer) == 2 for token in experts for layer in token)  # top-2 per layer
    assert len(out["choices"][0]["logprobs"]["token_logprobs"]) == out["usage"]["completion_tokens"]


def test_a_session_over_http(server, client):
    sid = httpx.post(f"{server}/v1/sessions", json={"record": True}, timeout=300).json()["id"]
    outputs = []
    for turn in ("First question?", "Second question?"):
        r = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": turn}],
            max_tokens=6,
            extra_body={"session_id": sid},
        )
        outputs.append(r)
    assert (
        outputs[1].usage.prompt_tokens
        > outputs[0].usage.prompt_tokens + outputs[0].usage.completion_tokens
    )
    assert outputs[1].usage.prompt_tokens_details.cached_tokens > 0  # the slot was kept
    traj = httpx.get(f"{server}/v1/sessions/{sid}/trajectory", timeout=300).json()
    assert sum(traj["loss_mask"]) == sum(o.usage.completion_tokens for o in outputs)
    assert (
        httpx.post(
            f"{server}/v1/sessions/{sid}/rollback", json={"steps": 1}, timeout=30
        ).status_code
        == 200
    )
    assert (
        httpx.post(
            f"{server}/v1/sessions/{sid}/rollback", json={"steps": 5}, timeout=30
        ).status_code
        == 400
    )
    report = probe(server)
    assert (
        report["live_sessions"] >= 1
        and sum(g["by_owner"]["session"] for g in report["groups"].values()) > 0
    )
    assert httpx.delete(f"{server}/v1/sessions/{sid}", timeout=300).status_code == 200
    again = httpx.delete(f"{server}/v1/sessions/{sid}", timeout=300)
    assert again.status_code == 409 and again.json()["error"]["code"] == "session_closed"
    assert httpx.delete(f"{server}/v1/sessions/nope", timeout=300).status_code == 404
    report = wait_idle(server)
    assert report["findings"] == [] and all(
        g["by_owner"]["session"] == 0 for g in report["groups"].values()
    )


def test_metrics_serve_pool_gauges_for_every_group(server, client):
    client.completions.create(model="tiny", prompt="warm up the counters", max_tokens=2)
    text = httpx.get(f"{server}/metrics", timeout=300).text
    metric = names.POOL_PAGES.replace(".", "_")
    for group in ("full.kv", "swa.kv", "swa.window", "linear.state"):
        for state in names.POOL_STATES:
            assert f'group="{group}"' in text and any(
                line.startswith(metric)
                and f'group="{group}"' in line
                and f'state="{state}"' in line
                for line in text.splitlines()
            ), (group, state)
    assert names.TTFT.replace(".", "_") in text
    assert names.PREFIX_QUERIED.replace(".", "_") in text


def test_probe_endpoints_need_the_token(server):
    assert httpx.get(f"{server}/debug/probe", timeout=300).status_code == 401
    wrong = httpx.get(
        f"{server}/debug/probe", headers={"Authorization": "Bearer nope"}, timeout=300
    )
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    assert httpx.post(f"{server}/debug/flush_cache", headers=AUTH, timeout=300).status_code == 200
    report = probe(server)
    assert report["groups"]["full.kv"]["free"] == report["groups"]["full.kv"]["capacity"]


def test_tracemalloc_reports_growth_by_traceback(server):
    assert httpx.post(f"{server}/debug/tracemalloc/start", headers=AUTH, timeout=300).json()[
        "tracing"
    ]
    httpx.post(
        f"{server}/v1/completions",
        json={"model": "t", "prompt": "x" * 200, "max_tokens": 4},
        timeout=300,
    )
    snap = httpx.get(f"{server}/debug/tracemalloc/snapshot?top=5", headers=AUTH, timeout=300).json()
    assert snap["traced_bytes"] > 0 and len(snap["top_growth"]) == 5
    assert all(entry["traceback"] for entry in snap["top_growth"])


def test_without_enable_probe_there_are_no_debug_endpoints():
    with kvwatch_server() as url:
        assert httpx.get(f"{url}/debug/probe", timeout=300).status_code == 404
        assert httpx.get(f"{url}/v1/models", timeout=300).json()["data"][0]["object"] == "model"
