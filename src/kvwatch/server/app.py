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

from kvwatch.server import completions, debug, stepping
from kvwatch.server import http_errors as errors
from kvwatch.server import session_routes as sessions
from kvwatch.server.clients import ClientWatch
from kvwatch.server.debug import heap_tracker
from kvwatch.server.departures import Departures
from kvwatch.server.finished import Exercised, FinishedLog
from kvwatch.server.idle import IdleReaper, SessionClock
from kvwatch.server.limits import RequestLimits
from kvwatch.server.overdue import IdleDeadlines
from kvwatch.server.settings import ServerSettings
from kvwatch.server.worker import EngineWorker

__all__ = ["ServerSettings", "create_app"]


def create_app(
    worker: EngineWorker,
    settings: ServerSettings | None = None,
    *,
    metrics: Callable[[], tuple[bytes, str]] | None = None,
    clock: SessionClock | None = None,
    coverage: Callable[[], dict] | None = None,
    on_ready: Callable[[], None] | None = None,
    heap_settle: Callable[[], object] | None = None,
) -> FastAPI:
    """``clock`` times idle sessions (default: monotonic seconds); tests pass their own.
    ``coverage`` counts the lifecycle transitions taken (``GET /debug/coverage``).
    ``on_ready`` is called once the app's startup is done (the worker runs the
    engine): from then on ``GET /health`` answers 200 and requests are served.
    ``heap_settle`` runs before every heap snapshot (``heap_tracker``)."""
    settings = settings or ServerSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        reaping = None
        if app.state.reaper is not None:
            reaping = asyncio.create_task(app.state.reaper.run())
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            if reaping is not None:
                reaping.cancel()
            worker.stop()

    app = FastAPI(title="kvwatch", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.worker = worker
    app.state.settings = settings
    app.state.heap = heap_tracker(heap_settle)
    app.state.coverage = coverage
    app.state.clock = clock or SessionClock()
    app.state.clock.follow(worker.engine.events)
    timeout = settings.session_idle_timeout_s
    app.state.reaper = None if timeout is None else IdleReaper(worker, app.state.clock, timeout)
    errors.install(app)
    app.include_router(completions.router)
    app.include_router(sessions.router)
    served = app
    if settings.enable_probe:
        worker.finished = FinishedLog(_exercised(worker))
        worker.departures = Departures()
        if app.state.reaper is not None:
            worker.deadlines = _deadlines(app.state.reaper, worker)
        app.include_router(debug.router)
        if settings.step_by_step:
            worker.stepping = True
            app.include_router(stepping.router)
        served = ClientWatch(app, worker.departures)

    _add_plain_routes(app, worker, settings, metrics)
    return RequestLimits(
        served, max_body_bytes=settings.max_body_bytes, max_header_bytes=settings.max_header_bytes
    )


def _exercised(worker: EngineWorker) -> Exercised:
    """What each request exercised, for the finished log (page and window as the
    engine's cache has them)."""
    cache = worker.engine.config.cache
    exercised = Exercised(page=cache.page_size, window=cache.window)
    exercised.follow(worker.engine.events)
    return exercised


def _deadlines(reaper: IdleReaper, worker: EngineWorker) -> IdleDeadlines:
    """The idle-timeout oracle beside the reaper it judges: its own clock readings
    (the reaper's time source), its own subscription to the engine's events."""
    deadlines = IdleDeadlines(reaper.timeout, reaper.sweeps_after, now=reaper.clock.now)
    deadlines.follow(worker.engine.events)
    reaper.clock.observer = deadlines.used
    return deadlines


def _add_plain_routes(
    app: FastAPI,
    worker: EngineWorker,
    settings: ServerSettings,
    metrics: Callable[[], tuple[bytes, str]] | None,
) -> None:
    """``/health``, ``/v1/models`` and, when given an exposition, ``/metrics``."""

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
