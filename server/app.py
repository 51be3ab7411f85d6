"""The FastAPI app: routes, error handlers, a body-size limit and the worker's lifetime.

``create_app`` takes a started-or-not ``EngineWorker`` and ``ServerSettings``;
telemetry is not its business. Whoever composes the server may pass a
``metrics`` callable that renders the ``/metrics`` page (``kvwatch serve``
passes the Prometheus exporter's).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.responses import Response

from kvwatch.server import completions, debug, errors, sessions
from kvwatch.server.debug import HeapTracker
from kvwatch.server.errors import error_body
from kvwatch.server.worker import EngineWorker


@dataclass(frozen=True)
class ServerSettings:
    model_name: str = "kvwatch-tiny-hybrid"
    enable_probe: bool = False
    probe_token: str | None = None
    capture_content: bool = False  # put prompt text on spans (off: privacy by default)
    max_body_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.probe_token is not None and not self.probe_token:
            raise ValueError("probe_token must not be empty")


def create_app(
    worker: EngineWorker,
    settings: ServerSettings | None = None,
    *,
    metrics: Callable[[], tuple[bytes, str]] | None = None,
) -> FastAPI:
    settings = settings or ServerSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    app = FastAPI(title="kvwatch", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.worker = worker
    app.state.settings = settings
    app.state.heap = HeapTracker()
    errors.install(app)
    app.include_router(completions.router)
    app.include_router(sessions.router)
    if settings.enable_probe:
        app.include_router(debug.router)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        max_len = worker.engine.config.model.max_model_len
        card = {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "kvwatch"}
        return {"object": "list", "data": [{**card, "max_model_len": max_len}]}

    if metrics is not None:

        @app.get("/metrics", include_in_schema=False)
        async def metrics_page():
            body, content_type = metrics()
            return Response(body, media_type=content_type)

    return BodyLimit(app, settings.max_body_bytes)


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes gets a 413 before any handler runs."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit
        self.state = getattr(app, "state", None)

    def __getattr__(self, name):  # the wrapped app's attributes (routes, state, ...)
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await _too_large(send, self.limit)
        # Read the whole body up front (bounded), then replay it to the app.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await _too_large(send, self.limit)
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


async def _too_large(send, limit: int) -> None:
    body = json.dumps(
        error_body(413, f"the request body is larger than {limit} bytes", code="body_too_large")
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
