"""RequestLimits: ASGI middleware that bounds a request's headers and body.

Invariant: no handler ever sees a request whose header block (names plus
values) exceeds ``max_header_bytes`` or whose body exceeds ``max_body_bytes``;
such a request gets an OpenAI-style JSON error (431 or 413) and nothing else
runs. The body is read at most ``max_body_bytes + one chunk`` far before the
413, so a client cannot make the server buffer more than that.

Before it answers 413 the server reads the rest of the body and drops it (up
to ``DRAIN_LIMIT`` bytes): a client that sends its whole body before it reads
an answer (Python's ``urllib``, many others) would otherwise find the
connection closed under it and see a reset instead of the 413.

uvicorn bounds the raw request head before any of this runs (``kvwatch
serve`` sets ``h11_max_incomplete_event_size``); this check is what turns a
merely large header block into a JSON answer.
"""

from __future__ import annotations

import json

from kvwatch.server.http_errors import error_body

DRAIN_LIMIT = 64 * 1024 * 1024  # bytes of an oversized body read and dropped before the 413


class RequestLimits:
    def __init__(self, app, *, max_body_bytes: int, max_header_bytes: int) -> None:
        self.app = app
        self.max_body_bytes, self.max_header_bytes = max_body_bytes, max_header_bytes
        self.state = getattr(app, "state", None)

    def __getattr__(self, name):  # the wrapped app's attributes (routes, state, ...)
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope.get("headers", ())
        if sum(len(k) + len(v) for k, v in headers) > self.max_header_bytes:
            message = f"the request headers are larger than {self.max_header_bytes} bytes"
            return await _refuse(send, 431, message, "headers_too_large")
        declared = dict(headers).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            if declared.isdigit() and int(declared) <= DRAIN_LIMIT:
                await _drain(receive, DRAIN_LIMIT)
            return await _body_too_large(send, self.max_body_bytes)
        # Read the whole body up front (bounded), then replay it to the app.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                if message.get("more_body", False):
                    await _drain(receive, DRAIN_LIMIT - size)
                return await _body_too_large(send, self.max_body_bytes)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)


async def _drain(receive, budget: int) -> None:
    """Read and drop the rest of a body, at most ``budget`` bytes of it."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def _body_too_large(send, limit: int) -> None:
    message = f"the request body is larger than {limit} bytes"
    await _refuse(send, 413, message, "body_too_large")


async def _refuse(send, status: int, message: str, code: str) -> None:
    body = json.dumps(error_body(status, message, code=code)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
