"""Locust users for OpenAI-compatible servers.

``StreamingChatUser`` streams chat completions over SSE and reports, besides
the HTTP request Locust's client records, derived samples through
``events.request.fire``: ``TTFT`` (time to the first content chunk), ``ITL``
(mean gap between content chunks) and, for every completion that ended well,
streamed or not, ``E2E`` (the whole request), all in milliseconds; ``E2E``'s
``context`` carries the usage the server returned (``timings.py`` keeps them).
``AgentUser`` runs a streaming session: it opens one on start, takes a turn
per task, and closes it on stop.

These run in Locust's own process (gevent); nothing here imports the engine.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator

import gevent
import requests
from locust import HttpUser, between, task

from kvwatch import MODEL_NAME
from kvwatch.loadtests.statuses import failpoint_refusal

# where a completion's finish reason rides along with its usage, up to ``_answered``
FINISH_REASON = "_finish_reason"

WORDS = [
    "pool",
    "page",
    "tree",
    "slot",
    "window",
    "state",
    "session",
    "prefix",
    "cache",
    "token",
    "turn",
    "agent",
]


def failure_text(resp) -> str:
    """Why a request failed: the status and the start of the body, or, when no
    answer came at all (status 0), the connection error."""
    if not resp.status_code:
        return f"no answer: {resp.error!r}"[:300]
    return f"HTTP {resp.status_code}: {resp.text[:200]}"


def sentence(rng: random.Random, lo: int = 4, hi: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def mark_failed(resp) -> None:
    """Mark an answer other than 200: a failure, unless a failpoint refused it."""
    if failpoint_refusal(resp.status_code, resp.text or ""):
        resp.success()
    else:
        resp.failure(failure_text(resp))


def _sse_data(resp) -> Iterator[str]:
    """The payload of each ``data:`` line of a server-sent-events answer, in order."""
    for raw in resp.iter_lines():
        line = raw.decode() if isinstance(raw, bytes) else raw
        if line.startswith("data: "):
            yield line[6:]


def _read_stream(
    resp,
    stamps: list[float],
    text: list[str],
    cut_after: int | None,
    stall: float,
    on_start: Callable[[], object] | None,
    usage: dict,
) -> bool:
    """Read a streamed completion into ``stamps`` (when each content chunk came)
    and ``text`` (the chunks); ``cut_after``, ``stall`` and ``on_start`` as
    ``StreamingChatUser.stream_chat`` takes them.

    True once ``[DONE]`` arrives: the caller reports the timings. False when the
    answer ends any other way, ``resp`` already marked: failed on an error event
    or a stream that stops short of ``[DONE]``, succeeded when the client hangs
    up after ``cut_after`` chunks (that disconnect is the load, not a failure).
    """
    for data in _sse_data(resp):
        if on_start is not None:
            on_start()
            on_start = None
        if data == "[DONE]":
            return True
        chunk = json.loads(data)
        if "error" in chunk:
            message = chunk["error"]["message"]
            if failpoint_refusal(200, message):
                resp.success()
            else:
                resp.failure(message)
            return False
        usage.update(chunk.get("usage") or {})
        if chunk["choices"] and (reason := chunk["choices"][0].get("finish_reason")):
            usage[FINISH_REASON] = reason
        delta = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
        if not delta:
            continue
        stamps.append(time.perf_counter())
        text.append(delta)
        if cut_after is not None and len(stamps) >= cut_after:
            resp.close()  # hang up mid-stream
            resp.success()
            return False
        if stall and len(stamps) == 1:
            gevent.sleep(stall)
    resp.failure("the stream ended without [DONE]")
    return False


class StreamingChatUser(HttpUser):
    abstract = True
    wait_time = between(0.0, 0.05)
    model = MODEL_NAME
    max_tokens = 12

    def on_start(self) -> None:
        self.rng = random.Random(hash((id(self), time.monotonic_ns())))

    def stream_chat(
        self,
        messages: list[dict],
        *,
        name: str,
        session_id: str | None = None,
        max_tokens: int | None = None,
        cut_after: int | None = None,
        stall: float = 0.0,
        extra: dict | None = None,
        on_start: Callable[[], object] | None = None,
    ) -> str:
        """One streamed completion; returns its text (empty on failure).

        ``cut_after``: the client leaves after that many content chunks (a
        disconnect mid-stream, which the server must turn into an abort).
        ``stall``: the client stops reading for that long after the first chunk.
        ``extra``: fields added to the body. ``on_start``: called once the first
        event arrives (the server has the request by then).
        """
        body = self._chat_body(messages, max_tokens, session_id, extra)
        start = time.perf_counter()
        stamps: list[float] = []
        text: list[str] = []
        usage: dict = {}
        with self.client.post(
            "/v1/chat/completions", json=body, name=name, stream=True, catch_response=True
        ) as resp:
            if resp.status_code != 200:
                mark_failed(resp)
                return ""
            if not _read_stream(resp, stamps, text, cut_after, stall, on_start, usage):
                return ""
        self._report(name, start, stamps)
        self._answered(name, start, usage)
        return "".join(text)

    def _chat_body(
        self,
        messages: list[dict],
        max_tokens: int | None,
        session_id: str | None,
        extra: dict | None,
    ) -> dict:
        """A streamed, greedy chat request for this user's model; ``extra``'s fields
        go in too, and ``session_id`` only when there is one."""
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens or self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **(extra or {}),
        }
        if session_id is not None:
            body["session_id"] = session_id
        return body

    def chat(
        self,
        messages: list[dict],
        *,
        name: str,
        max_tokens: int = 8,
        temperature: float = 0.0,
        session_id: str | None = None,
        seed: int | None = None,
        timeout: float | None = None,
        extra: dict | None = None,
    ) -> dict | None:
        """One non-streamed chat completion with its token ids; None on failure.

        With ``timeout`` the client hangs up after that long: a disconnect while
        the request is queued or in prefill, which counts as a success.
        ``extra``: fields added to the body.
        """
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "return_token_ids": True,
            **(extra or {}),
        }
        if session_id is not None:
            body["session_id"] = session_id
        if seed is not None:
            body["seed"] = seed
        start = time.perf_counter()
        with self.client.post(
            "/v1/chat/completions", json=body, name=name, catch_response=True, timeout=timeout
        ) as resp:
            if timeout is not None and isinstance(resp.error, requests.Timeout):
                resp.success()
                return None
            if resp.status_code != 200:
                mark_failed(resp)
                return None
            data = resp.json()
        choices = data.get("choices") or [{}]
        usage = {**(data.get("usage") or {}), FINISH_REASON: choices[0].get("finish_reason")}
        self._answered(name, start, usage)
        return data

    def _answered(self, name: str, start: float, usage: dict) -> None:
        """An ``E2E`` sample for a completion that ended well, with its usage and
        its finish reason (``usage[FINISH_REASON]``, as the answer gave it)."""
        details = usage.get("prompt_tokens_details") or {}
        self.environment.events.request.fire(
            request_type="E2E",
            name=name,
            response_time=(time.perf_counter() - start) * 1000,
            response_length=0,
            exception=None,
            context={
                "prompt_tokens": usage.get("prompt_tokens", 0),
                "cached_tokens": details.get("cached_tokens", 0) or 0,
                "output_tokens": usage.get("completion_tokens", 0),
                "finish_reason": usage.get(FINISH_REASON),
            },
        )

    def _report(self, name: str, start: float, stamps: list[float]) -> None:
        fire = self.environment.events.request.fire
        if stamps:
            fire(
                request_type="TTFT",
                name=name,
                response_time=(stamps[0] - start) * 1000,
                response_length=0,
                exception=None,
                context={},
            )
        if len(stamps) > 1:
            itl = (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1000
            fire(
                request_type="ITL",
                name=name,
                response_time=itl,
                response_length=0,
                exception=None,
                context={},
            )


class AgentUser(StreamingChatUser):
    """A multi-turn agent in one streaming session (the session keeps its cache slot)."""

    abstract = True

    def on_start(self) -> None:
        super().on_start()
        resp = self.client.post("/v1/sessions", json={"record": False}, name="/v1/sessions")
        self.session_id = resp.json()["id"] if resp.status_code == 200 else None

    @task
    def turn(self) -> None:
        if self.session_id is None:
            return
        messages = [{"role": "user", "content": sentence(self.rng)}]
        self.stream_chat(messages, name="session turn", session_id=self.session_id)

    def on_stop(self) -> None:
        if self.session_id is not None:
            self.client.delete(f"/v1/sessions/{self.session_id}", name="/v1/sessions/[id]")
            self.session_id = None
