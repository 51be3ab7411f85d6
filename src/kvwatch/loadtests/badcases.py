"""The bad-input cases, and what an OpenAI-compatible server must answer to each.

Kept apart from the Locust user (``badinput.py``) so the table and its judge
load without Locust.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import NamedTuple

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]
TOO_LONG = "a prompt one token longer than the served context"
FILLS = "a prompt that, with max_tokens, fills the served context exactly"
DEFAULT_CONTEXT = 128 * 1024  # a server that does not say: longer than most serve


class Case(NamedTuple):
    """One request, and what an OpenAI-compatible server must answer to it.

    ``valid``: a valid OpenAI request (a 2xx), which an engine that lacks the
    feature may refuse instead, with an OpenAI-style 4xx. Otherwise the request
    is invalid and must be refused that way, except on the engines named in
    ``accepted_by``, which are known to answer it. ``required``: a valid request no
    server may refuse for what it is (a prompt that fills the context refused as too
    long is a bug); a refusal for another reason (memory under pressure) is judged
    as any valid request's.
    ``sessions``: kvwatch's own session API, sent only to kvwatch servers. The body's ``model`` is the
    served model's name, so no case is refused only for naming another model.
    """

    name: str
    path: str
    body: object  # raw bytes, or a JSON-able value
    valid: bool = False
    accepted_by: frozenset[str] = frozenset()
    sessions: bool = False
    required: bool = False


def _chat(**fields) -> dict:
    return {"messages": MSG, "max_tokens": 4, **fields}


VLLM = frozenset({"vllm"})

CASES: tuple[Case, ...] = (
    Case(name="not json", path=CHAT, body=b'{"model": "m", "messages": ['),
    Case(name="body is a list", path=CHAT, body=[1, 2, 3]),
    Case(name="no messages", path=CHAT, body={"max_tokens": 4}),
    Case(name="empty messages", path=CHAT, body=_chat(messages=[])),
    # vLLM takes any role name (a custom message type) into the chat template
    Case(
        name="unknown role",
        path=CHAT,
        body=_chat(messages=[{"role": "wizard", "content": "x"}]),
        accepted_by=VLLM,
    ),
    Case(
        name="content is a number", path=CHAT, body=_chat(messages=[{"role": "user", "content": 7}])
    ),
    Case(name="negative max_tokens", path=CHAT, body=_chat(max_tokens=-1)),
    # OpenAI's range is 0..2; vLLM has no upper bound
    Case(name="temperature too high", path=CHAT, body=_chat(temperature=9), accepted_by=VLLM),
    Case(name="n > 1", path=CHAT, body=_chat(n=4), valid=True),
    Case(name="stop strings", path=CHAT, body=_chat(stop=["\n"]), valid=True),
    Case(
        name="unknown session", path=CHAT, body=_chat(session_id="no-such-session"), sessions=True
    ),
    Case(name="malformed session id", path=CHAT, body=_chat(session_id="../../etc"), sessions=True),
    Case(name="token id out of range", path=TEXT, body={"prompt": [1, 2, 10**9], "max_tokens": 4}),
    Case(name="negative token id", path=TEXT, body={"prompt": [-5], "max_tokens": 4}),
    Case(name="empty prompt", path=TEXT, body={"prompt": "", "max_tokens": 4}),
    Case(name="prompt too long", path=TEXT, body={"prompt": TOO_LONG, "max_tokens": 4}),
    Case(
        name="prompt and max_tokens fill the context",
        path=TEXT,
        body={"prompt": FILLS, "max_tokens": 4, "temperature": 0},  # greedy: replayed too
        valid=True,
        required=True,
    ),
    Case(
        name="rollback unknown session",
        path="/v1/sessions/nope/rollback",
        body={"steps": 1},
        sessions=True,
    ),
)


def cases_for(engine: str) -> tuple[Case, ...]:
    """The cases that mean something to ``engine`` (a gauge preset's name)."""
    return tuple(c for c in CASES if engine == "kvwatch" or not c.sessions)


def body_of(case: Case, model: str, context: Callable[[], int]) -> bytes:
    """The bytes sent for ``case``: JSON bodies name ``model``; the too-long
    prompt is one token over ``context()``, the served context, and the filling
    one leaves exactly ``max_tokens`` of it (a short prompt where the server
    does not say its context: nothing to fill)."""
    body = case.body
    if isinstance(body, bytes):
        return body
    if isinstance(body, dict):
        body = {"model": model, **body}
        if body.get("prompt") == TOO_LONG:
            body["prompt"] = [65] * (context() + 1)
        elif body.get("prompt") == FILLS:
            room = context()
            body["prompt"] = [65] * (room - body["max_tokens"] if room != DEFAULT_CONTEXT else 8)
    return json.dumps(body).encode()


def judge(case: Case, engine: str, status: int, body: str) -> str | None:
    """Why this answer is wrong for ``case`` on ``engine``, or None."""
    if 200 <= status < 300 and (case.valid or engine in case.accepted_by):
        return None
    if case.required and 400 <= status < 500 and _about_context(body):
        return f"refused as too long, though it fits the context exactly: {body[:200]}"
    if not 400 <= status < 500:
        return f"want a 4xx, got {status}: {body[:200]}"
    try:
        error = json.loads(body)["error"]
        assert isinstance(error["message"], str) and error["type"]
    except (ValueError, KeyError, TypeError, AssertionError):
        return f"not an OpenAI-style error body: {body[:200]}"
    return None


def _about_context(body: str) -> bool:
    """Whether an error body refuses the request for its length against the context."""
    text = body.lower()
    return any(w in text for w in ("context_length_exceeded", "context length", "max_model_len"))


def context_of(models: Callable[[], object], model: str) -> int:
    """The context ``model`` serves, from a ``/v1/models`` answer's JSON (read
    by ``models``), or a long one when the answer does not say."""
    try:
        cards = models()["data"]
        card = next((c for c in cards if c.get("id") == model), cards[0])
        return int(card["max_model_len"])
    except (ValueError, KeyError, TypeError, IndexError, StopIteration):
        return DEFAULT_CONTEXT
