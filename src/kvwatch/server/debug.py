"""Probe endpoints: only mounted with ``--enable-probe``.

With a probe token set, every call needs ``Authorization: Bearer TOKEN``.
``/debug/probe`` is ``Engine.probe()`` as JSON (docs/contracts.md has the shape);
``/debug/flush_cache`` evicts everything unreferenced and answers 409 while
any request is live (queued, running, retracted, or paused: a held request
has no work for the engine, yet it comes back for its prefix);
``/debug/watch`` probes after every step and ``/debug/latched`` hands over the probes that showed a finding; ``/debug/finished`` the greedy
and seeded requests finished since the last call, for the equivalence replay; the tracemalloc endpoints start
heap tracking, report the largest growth since the previous snapshot, by
traceback, and (``mark``) keep a reference that later snapshots report their
growth by site against. With ``scope=engine`` a snapshot counts only what the
engine's own code allocated, with ``scope=kvwatch`` what any of kvwatch's code
in the process did, and adds the live bytes of its largest allocation sites
(``by_site``, file:line), which is what the heap detector follows.
"""

from __future__ import annotations

import hmac
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Depends, Request

from kvwatch.contracts import FindingKind, ProbeReport, finding
from kvwatch.engine.request import Status
from kvwatch.instrumentation.census import census
from kvwatch.instrumentation.heap_tracker import TRACE_FRAMES, HeapTracker, NotTracing
from kvwatch.instrumentation.registries import module_roots, walk
from kvwatch.server.http_errors import ApiError
from kvwatch.server.worker import EngineWorker


def _files(package: str) -> str:
    """A package's files as a glob, found without importing it."""
    return str(Path(importlib.util.find_spec(package).origin).parent / "*")


ENGINE_FILES = _files("kvwatch.engine")
# Everything kvwatch runs in a server process (engine, server, listeners,
# helpers) but the model: it keeps no state of its own, and torch's per-shape
# caches, which grow with every new prompt length up to a bound, are counted
# against the model's lines.
KVWATCH_FILES = (
    *(
        _files(p)
        for p in ("kvwatch", "kvwatch.engine", "kvwatch.server", "kvwatch.instrumentation")
    ),
    "!" + _files("kvwatch.engine.model"),
)


def heap_tracker(settle: Callable[[], object] | None = None) -> HeapTracker:
    """The server's sampler: the whole process, the engine's own code (``engine``),
    or all of kvwatch's code in the process (``kvwatch``); ``settle`` finishes the
    work other threads have in hand before each snapshot (the span file's batch)."""
    return HeapTracker({"engine": ENGINE_FILES, "kvwatch": KVWATCH_FILES}, settle)


def require_token(request: Request) -> None:
    token = request.app.state.settings.probe_token
    if not token:
        return
    got = request.headers.get("authorization", "")
    if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
        raise ApiError(
            401, "the probe endpoints need Authorization: Bearer <probe token>", code="unauthorized"
        )


router = APIRouter(prefix="/debug", dependencies=[Depends(require_token)])


def _worker(request: Request) -> EngineWorker:
    return request.app.state.worker


@router.get("/probe")
async def probe(request: Request):
    """The engine's probe, with the size of every registry the server and the engine
    hold (``kvwatch.instrumentation.registries``), read on the engine thread between steps; a
    container over the bound its class declares is a ``registry`` finding."""
    worker, state = _worker(request), request.app.state

    def take() -> ProbeReport:
        found = walk({**state._state, **module_roots()})
        report = worker.engine.probe()
        over = tuple(finding(FindingKind.REGISTRY, None, [], b.detail) for b in found.breaches)
        worker.check_departures()
        left = worker.departures.findings() if worker.departures is not None else ()
        if worker.deadlines is not None:
            left = (*left, *worker.deadlines.findings())
        return report._replace(registries=found.sizes, findings=(*report.findings, *over, *left))

    return (await worker.run(take)).to_json()


@router.get("/census")
async def census_endpoint(request: Request):
    """Live instances of each kvwatch class in the server process, counted on the
    engine thread between steps (``kvwatch.instrumentation.census``)."""
    return {"census": await _worker(request).run(census)}


@router.post("/flush_cache")
async def flush_cache(request: Request):
    worker = _worker(request)

    def flush() -> dict:
        engine = worker.engine
        if engine.has_unfinished() or engine.request_ids(Status.PAUSED):
            raise ApiError(409, "requests are still running; flush when idle", code="engine_busy")
        engine.flush_cache()
        return {"flushed": True, "step": engine.step_count}

    return await worker.run(flush)


@router.post("/failpoints")
async def failpoints(request: Request, armed: bool = True):
    """Arm the engine's failpoints (the default) or disarm them: disarmed, no site
    counts or fails. Nothing happens where the engine has none configured."""
    worker = _worker(request)
    await worker.run(worker.engine.arm_failpoints, armed)
    return {"armed": armed}


@router.post("/watch")
async def watch(request: Request, on: bool = True):
    """Probe after every engine step and keep the probes with findings or exceeded
    bounds for ``/debug/latched`` (a state that lasts a few steps is then seen)."""
    worker = _worker(request)
    await worker.run(worker.watch, on)
    return {"watching": on}


@router.get("/latched")
async def latched(request: Request):
    """The probes kept since the previous call (oldest first), and how many more
    had a finding but were not kept."""
    probes, dropped = await _worker(request).run(_worker(request).latched)
    return {"probes": [p.to_json() for p in probes], "dropped": dropped}


@router.get("/coverage")
async def coverage(request: Request):
    """Lifecycle transitions, and combination and boundary edges, taken since the
    server started, per machine (``{"request": {"new -> queued": 5, ...},
    "session": {...}, "slot": {...}, "turn abort": {...}, "page offset": {...}, ...}``)."""
    counted = request.app.state.coverage
    if counted is None:
        raise ApiError(404, "this server does not count lifecycle transitions", code="not_found")
    return await _worker(request).run(counted)


@router.get("/timing")
async def timing(request: Request):
    """The engine thread's CPU time since the server started: steps, the per-step
    watch, and calls between steps (``worktime.py``)."""
    return _worker(request).work.to_json()


@router.get("/finished")
async def finished(request: Request):
    """The comparable requests finished since the previous call (``finished.py``)."""
    worker = _worker(request)
    return worker.finished.take()


@router.post("/tracemalloc/start")
async def tracemalloc_start(request: Request, frames: int = TRACE_FRAMES):
    """Start (or restart with another traceback depth): fewer frames cost less per allocation."""
    if not 1 <= frames <= 64:
        raise ApiError(400, "frames must be in [1, 64]", code="invalid_value", param="frames")
    return await _worker(request).run(request.app.state.heap.start, frames)


@router.get("/tracemalloc/snapshot")
async def tracemalloc_snapshot(
    request: Request,
    top: int = 10,
    scope: Literal["process", "engine", "kvwatch"] = "process",
    sites: int = 0,
):
    if not 1 <= top <= 100:
        raise ApiError(400, "top must be in [1, 100]", code="invalid_value", param="top")
    if not 0 <= sites <= 200:
        raise ApiError(400, "sites must be in [0, 200]", code="invalid_value", param="sites")

    return await _worker(request).run(_tracing, request.app.state.heap.sample, scope, top, sites)


@router.post("/tracemalloc/mark")
async def tracemalloc_mark(
    request: Request, scope: Literal["process", "engine", "kvwatch"] = "process"
):
    """Keep the heap now as the reference of later snapshots' ``since_mark``."""
    return await _worker(request).run(_tracing, request.app.state.heap.mark, scope)


def _tracing(call, *args) -> dict:
    try:
        return call(*args)
    except NotTracing:
        raise ApiError(
            409, "heap tracking is off; POST /debug/tracemalloc/start first", code="not_tracing"
        ) from None
