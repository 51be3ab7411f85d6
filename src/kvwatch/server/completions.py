"""``POST /v1/chat/completions`` and ``POST /v1/completions``.

A request flows: validate (protocol.py) -> build the prompt tokens on the
engine thread (a session turn reads the session there, atomically) -> submit
-> stream deltas as SSE, or collect them. A client that goes away aborts its
request wherever it is: queued, mid-prefill or decoding.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from kvwatch.engine.engine import Completion, Engine
from kvwatch.engine.errors import EngineError
from kvwatch.engine.model.tokenizer import ChatMessage, TextStream
from kvwatch.engine.request import RequestOutput, SamplingParams
from kvwatch.server.bodies import ChatCompletionRequest, CompletionRequest
from kvwatch.server.clients import REQUESTS
from kvwatch.server.http_errors import ApiError, error_body
from kvwatch.server.worker import STAGES, EngineWorker, Scripted, Stream

DEFAULT_MAX_TOKENS = 256
DISCONNECT_POLL_S = 0.2

router = APIRouter()


def _worker(request: Request) -> EngineWorker:
    return request.app.state.worker


def _params(body: ChatCompletionRequest | CompletionRequest, logprobs: bool) -> SamplingParams:
    return SamplingParams(
        max_tokens=body.token_limit or DEFAULT_MAX_TOKENS,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
        return_routed_experts=body.return_routed_experts,
    )


def _fit(
    tokens: list[int], params: SamplingParams, engine: Engine, explicit: bool
) -> SamplingParams:
    """Clamp a default token budget to the context left; an explicit one must fit."""
    room = engine.config.model.max_model_len - len(tokens)
    if room >= params.max_tokens:
        return params
    if explicit or room < 1:
        raise ApiError(
            400,
            f"the prompt has {len(tokens)} tokens and max_tokens is {params.max_tokens}; "
            f"the context holds {engine.config.model.max_model_len}",
            code="context_length_exceeded",
        )
    return replace(params, max_tokens=room)


async def _start(
    request: Request,
    body: ChatCompletionRequest | CompletionRequest,
    prompt: Callable[[Engine], list[int]],
    params: SamplingParams,
    labels: dict[str, str],
) -> Stream:
    worker = _worker(request)
    script = _controls(request, body)  # refused before any work is done

    def add() -> tuple[list[int], SamplingParams]:
        tokens = prompt(worker.engine)
        return tokens, _fit(tokens, params, worker.engine, body.token_limit is not None)

    try:
        tokens, fitted = await worker.run(add)
        stream = await worker.submit(
            tokens,
            fitted,
            session_id=body.session_id,
            labels=labels,
            script=script,
            request_id=_client_id(request),
        )
        if (started := request.scope.get(REQUESTS)) is not None:  # ClientWatch follows it
            started.append(stream.request_id)
        return stream
    except (ApiError, EngineError):  # answered by their handlers (errors.py)
        raise
    except ValueError as exc:  # the tokenizer's and the template's checks on the prompt
        raise ApiError(400, str(exc), code="invalid_prompt") from None


def _client_id(request: Request) -> str | None:
    """``X-Request-Id``, the engine's id for the request, honoured with the probe on (an
    id already live is a 400): a test client then names its requests in the probe's
    answers. Without the probe the engine numbers them."""
    if not request.app.state.settings.enable_probe:
        return None
    return request.headers.get("x-request-id") or None


def _controls(request: Request, body) -> Scripted | None:
    """The request's test controls; refused unless the server runs with ``--enable-probe``."""
    controls = body.kvwatch
    if controls is None:
        return None
    if not request.app.state.settings.enable_probe:
        raise ApiError(
            400,
            "the kvwatch test controls need a server started with --enable-probe",
            code="test_controls_disabled",
            param="kvwatch",
        )
    retract, pause = controls.retract_after, controls.pause_after_output
    if retract is not None and pause is not None:
        raise _bad_controls("retract_after and pause_after_output exclude each other")
    if controls.hold_s is not None and pause is None:
        raise _bad_controls("hold_s holds a pause: it needs pause_after_output")
    if controls.fail_load and retract is None:
        raise _bad_controls("fail_load fails a recovery's load: it needs retract_after")
    if controls.abort_in in STAGES:
        if retract is not None or pause is not None:
            raise _bad_controls(f"abort_in {controls.abort_in!r} takes no retraction or pause")
        return Scripted(action="abort", tokens=0, hold_steps=0, abort_in=controls.abort_in)
    action, tokens = ("retract", retract) if pause is None else ("pause", pause)
    reaches = {"retract": "retracted", "pause": "paused"}[action]
    if controls.abort_in is not None and (
        tokens is None or controls.abort_in not in (reaches, "recovering")
    ):
        need = {"retracted": "retract_after", "paused": "pause_after_output"}
        wanted = need.get(controls.abort_in, "retract_after or pause_after_output")
        raise _bad_controls(f"abort_in {controls.abort_in!r} needs {wanted}")
    if tokens is None:
        return None
    return Scripted(
        action=action,
        tokens=tokens,
        hold_steps=controls.hold_steps,
        abort_in=controls.abort_in,
        hold_s=controls.hold_s,
        fail_load=controls.fail_load,
    )


def _bad_controls(problem: str) -> ApiError:
    return ApiError(400, problem, code="invalid_value", param="kvwatch")


def _labels(request: Request, operation: str, body, text: str) -> dict[str, str]:
    labels = {"gen_ai.operation.name": operation, "gen_ai.request.model": body.model}
    if request.app.state.settings.capture_content:
        labels["gen_ai.prompt"] = text
    return labels


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, body: ChatCompletionRequest):
    messages = [
        ChatMessage("system" if m.role == "developer" else m.role, m.text()) for m in body.messages
    ]

    def prompt(engine: Engine) -> list[int]:
        if body.session_id is None:
            return engine.chat_template.render(messages)
        history = engine.session_tokens(body.session_id)
        return engine.chat_template.continue_session(history, messages)

    labels = _labels(request, "chat", body, "\n".join(m.content for m in messages))
    stream = await _start(request, body, prompt, _params(body, body.logprobs), labels)
    shape = _Shape("chat", stream.request_id, body)
    if body.stream:
        return _sse(request, stream, shape)
    return await _respond(request, stream, shape)


@router.post("/v1/completions")
async def completions(request: Request, body: CompletionRequest):
    def prompt(engine: Engine) -> list[int]:
        if isinstance(body.prompt, list):
            return list(body.prompt)
        return engine.tokenizer.encode(body.prompt)

    text = body.prompt if isinstance(body.prompt, str) else ""
    labels = _labels(request, "text_completion", body, text)
    stream = await _start(request, body, prompt, _params(body, bool(body.logprobs)), labels)
    shape = _Shape("text", stream.request_id, body)
    if body.stream:
        return _sse(request, stream, shape)
    return await _respond(request, stream, shape)


# -- response shapes ----------------------------------------------------------------------
class _Shape:
    """Builds chat or text-completion bodies and chunks for one request."""

    def __init__(self, kind: str, request_id: str, body) -> None:
        self.kind, self.body = kind, body
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        self.id = f"{prefix}-{request_id}"
        self.created = int(time.time())
        self.object = "chat.completion" if kind == "chat" else "text_completion"

    def _envelope(self, obj: str, choices: list) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.body.model,
            "choices": choices,
        }

    def chunk(
        self,
        text: str,
        finish_reason: str | None = None,
        first: bool = False,
        token_ids: list[int] | None = None,
    ) -> dict:
        """A streamed chunk; ``token_ids`` (the chunk's own) only with return_token_ids."""
        if self.kind == "chat":
            delta = (
                {"role": "assistant", "content": text}
                if first
                else ({"content": text} if text else {})
            )
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        if token_ids is not None and self.body.return_token_ids:
            choice["token_ids"] = list(token_ids)
        kind = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return self._envelope(kind, [choice])

    def usage(self, done: Completion) -> dict:
        prompt, out = len(done.prompt_token_ids), len(done.token_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": out,
            "total_tokens": prompt + out,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
        }

    def final(self, done: Completion) -> dict:
        if self.kind == "chat":
            message = {"role": "assistant", "content": done.text}
            choice = {"index": 0, "message": message, "finish_reason": done.finish_reason}
            choice["logprobs"] = _chat_logprobs(done) if self.body.logprobs else None
        else:
            choice = {"index": 0, "text": done.text, "finish_reason": done.finish_reason}
            choice["logprobs"] = _text_logprobs(done) if self.body.logprobs is not None else None
        out = self._envelope(self.object, [choice])
        out["usage"] = self.usage(done)
        if self.body.session_id is not None:
            out["session_id"] = self.body.session_id
        if done.routed_experts is not None:
            out["routed_experts"] = done.routed_experts.tolist()
        if self.body.return_token_ids:
            out["prompt_token_ids"] = list(done.prompt_token_ids)
            choice["token_ids"] = list(done.token_ids)
        return out


def _chat_logprobs(done: Completion) -> dict:
    return {
        "content": [
            {
                "token": _token_text(t),
                "logprob": lp,
                "bytes": [t] if t < 256 else [],
                "top_logprobs": [],
            }
            for t, lp in zip(done.token_ids, done.logprobs, strict=False)
        ]
    }


def _text_logprobs(done: Completion) -> dict:
    return {
        "tokens": [_token_text(t) for t in done.token_ids],
        "token_logprobs": list(done.logprobs),
        "top_logprobs": None,
        "text_offset": None,
    }


def _token_text(token: int) -> str:
    return bytes([token]).decode("latin-1") if token < 256 else f"<|{token}|>"


def _failure(done: Completion) -> ApiError:
    if done.error and done.error.startswith("internal error"):
        return ApiError(500, done.error, code="internal_error")
    return ApiError(400, done.error or "the request failed", code="request_failed")


# -- delivery -----------------------------------------------------------------------------
async def _next(request: Request, stream: Stream) -> RequestOutput | Completion | None:
    """The stream's next item, or None once the client has gone away.

    A busy stream never waits long enough to time out, so the disconnect
    check also runs every ``DISCONNECT_POLL_S`` between items.
    """
    loop = asyncio.get_running_loop()
    if not stream.checked_at:
        stream.checked_at = loop.time()
    while True:
        if loop.time() - stream.checked_at > DISCONNECT_POLL_S:
            stream.checked_at = loop.time()
            if await request.is_disconnected():
                return None
        try:
            return await asyncio.wait_for(stream.queue.get(), DISCONNECT_POLL_S)
        except TimeoutError:
            continue


def _abort_soon(request: Request, stream: Stream) -> None:
    _worker(request).abort_soon(stream.request_id)


async def _respond(request: Request, stream: Stream, shape: _Shape) -> JSONResponse:
    try:
        while True:
            item = await _next(request, stream)
            if item is None:
                _abort_soon(request, stream)
                return JSONResponse(error_body(400, "client disconnected"), status_code=400)
            if isinstance(item, Completion):
                break
    except asyncio.CancelledError:
        _abort_soon(request, stream)
        raise
    if item.finish_reason == "error":
        raise _failure(item)
    return JSONResponse(shape.final(item))


def _sse(request: Request, stream: Stream, shape: _Shape) -> StreamingResponse:
    include_usage = bool(shape.body.stream_options and shape.body.stream_options.include_usage)

    async def events() -> AsyncIterator[str]:
        done = False
        text = TextStream()
        ids = shape.body.return_token_ids
        try:
            if shape.kind == "chat":
                yield _data(shape.chunk("", first=True))
            while True:
                item = await _next(request, stream)
                if item is None:
                    return
                if isinstance(item, RequestOutput):
                    delta = text.feed(item.new_token_ids)
                    if delta or ids:  # with return_token_ids every token has its chunk
                        yield _data(shape.chunk(delta, token_ids=item.new_token_ids))
                    continue
                done = True
                if item.finish_reason == "error":
                    err = _failure(item)
                    yield _data(error_body(err.status, err.message, code=err.code))
                else:
                    last = shape.chunk(text.flush(), item.finish_reason, token_ids=[])
                    if ids:
                        last["prompt_token_ids"] = list(item.prompt_token_ids)
                    yield _data(last)
                    if include_usage:
                        yield _data({**shape.chunk(""), "choices": [], "usage": shape.usage(item)})
                yield "data: [DONE]\n\n"
                return
        finally:
            if not done:  # the client went away (or the server is stopping): abort
                _abort_soon(request, stream)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
