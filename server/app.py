"""The FastAPI app: routes, error handlers, request limits and the worker's lifetime.

``create_app`` takes a started-or-not ``EngineWorker`` and ``ServerSettings``;
telemetry is not its business. Whoever composes the server may pass a
``metrics`` callable that renders the ``/metrics`` page (``kvwatch serve``
passes the Prometheus exporter's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from kvwatch.server import completions, debug, errors, sessions
from kvwatch.server.debug import HeapTracker
from kvwatch.server.idle import SessionClock, close_idle_sessions
from kvwatch.server.limits import RequestLimits
from kvwatch.server.settings import ServerSettings
from kvwatch.server.worker import EngineWorker

__all__ = ["ServerSettings", "create_app"]


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
        reaper = None
        if settings.session_idle_timeout_s is not None:
            timeout = settings.session_idle_timeout_s
            reaper = asyncio.create_task(close_idle_sessions(worker, app.state.clock, timeout))
        try:
            yield
        finally:
            if reaper is not None:
                reaper.cancel()
            worker.stop()

    app = FastAPI(title="kvwatch", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.worker = worker
    app.state.settings = settings
    app.state.heap = HeapTracker()
    app.state.clock = SessionClock()
    app.state.clock.follow(worker.engine.events)
    errors.install(app)
    app.include_router(completions.router)
    app.include_router(sessions.router)
    if settings.enable_probe:
        app.include_router(debug.router)

    @app.get("/health")
    async def health():
        if worker.failure is not None:
            return JSONResponse({"status": "failed", "error": worker.failure}, status_code=503)
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

    return RequestLimits(
        app, max_body_bytes=settings.max_body_bytes, max_header_bytes=settings.max_header_bytes
    )
