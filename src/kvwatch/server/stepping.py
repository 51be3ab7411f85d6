"""Step-by-step endpoints: mounted with ``--enable-probe --step-by-step``.

The engine then steps only when a client asks (``EngineWorker.stepping``), so
a history of client messages (requests, turns, departures, flushes) lands at
the steps it names, over real HTTP connections::

    POST /debug/step       one engine step, between what came before it
                           (requests added, aborts of clients that left); then
                           the requests still live
    GET  /debug/requests   the requests still live, without a step

Both answer ``{"step": N, "requests": [{"id", "status", "prompt_tokens",
"output_tokens", "cached_tokens", "session_id"}, ...]}``: every request a
client still waits on, in the order they arrived, as the engine holds it
(``cached_tokens``: found cached at its first admission).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from kvwatch.engine.views import RequestInfo
from kvwatch.server.debug import require_token
from kvwatch.server.worker import EngineWorker

router = APIRouter(prefix="/debug", dependencies=[Depends(require_token)])


def _listing(worker: EngineWorker) -> dict:
    """(On the worker thread.) The step count and the live requests."""
    return {"step": worker.engine.step_count, "requests": [_row(i) for i in worker.live()]}


def _row(info: RequestInfo) -> dict:
    return {
        "id": info.request_id,
        "status": str(info.status),
        "prompt_tokens": info.prompt_tokens,
        "output_tokens": info.output_tokens,
        "cached_tokens": info.cached_tokens,
        "session_id": info.session_id,
    }


@router.post("/step")
async def step(request: Request):
    worker: EngineWorker = request.app.state.worker

    def one() -> dict:
        worker.step_once()
        return _listing(worker)

    return await worker.run(one)


@router.get("/requests")
async def requests(request: Request):
    worker: EngineWorker = request.app.state.worker
    return await worker.run(_listing, worker)
