"""The audit served from inside vLLM's engine core, between engine steps.

kvwatch's vLLM plugin (``vllm_plugin.py``) calls ``install`` in the engine
core when ``KVWATCH_VLLM_PROBE_PORT`` is set. From then on every call that
changes the scheduler's state runs under one lock (``EngineCore.step``,
``step_with_batch_queue``, ``add_request``, ``abort_requests``,
``reset_prefix_cache``), and a small HTTP server in a thread of the same
process takes that lock to read the state, so an audit never sees an
allocation half done::

    engine core thread:  step | add | step | abort | step ...   (each under LOCK)
    probe thread:             GET /audit -> audit_scheduler()   (under LOCK)

Endpoints, on loopback:

``GET /audit``
    ``{"step": N, "waiting": W, "running": R, "audit": Audit as JSON}``
    (``vllm_audit.py``; W and R: the scheduler's queues)
``POST /flush``
    ``reset_prefix_cache()``: drops every cached block no request holds;
    ``{"flushed": bool, "live_requests": N}`` (not flushed while blocks are
    held: by the N live requests, or leaked)
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import asdict

PORT_ENV = "KVWATCH_VLLM_PROBE_PORT"
GUARDED = ("step", "step_with_batch_queue", "add_request", "abort_requests", "reset_prefix_cache")

LOCK = threading.RLock()
log = logging.getLogger("kvwatch.vllm")


class _State:
    scheduler = None  # the engine core's scheduler, once built
    steps = 0


def install(port: int) -> None:
    """Guard the engine core's state-changing calls, keep its scheduler when it
    is built (after this runs: the plugin loads first in ``EngineCore.__init__``),
    and serve the audit on ``port``."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    for name in GUARDED:
        if (original := getattr(EngineCore, name, None)) is not None:
            setattr(EngineCore, name, _guarded(original, counts_steps=name.startswith("step")))
    init = Scheduler.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        _State.scheduler = self

    Scheduler.__init__ = __init__
    threading.Thread(target=_serve, args=(port,), name="kvwatch-probe", daemon=True).start()


def _guarded(method, counts_steps: bool):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with LOCK:
            _State.steps += counts_steps
            return method(self, *args, **kwargs)

    return call


def _serve(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from kvwatch.targets.vllm_audit import audit_scheduler

    app = FastAPI()

    def ready() -> JSONResponse | None:
        if _State.scheduler is None:
            return JSONResponse({"error": "the engine core is starting"}, status_code=503)
        return None

    @app.get("/audit")
    def audit():  # a plain def: FastAPI runs it in a worker thread, so the lock may wait
        if (starting := ready()) is not None:
            return starting
        with LOCK:
            scheduler = _State.scheduler
            return {
                "step": _State.steps,
                "waiting": len(scheduler.waiting),
                "running": len(scheduler.running),
                "audit": asdict(audit_scheduler(scheduler)),
            }

    @app.post("/flush")
    def flush():
        if (starting := ready()) is not None:
            return starting
        with LOCK:
            flushed = bool(_State.scheduler.reset_prefix_cache())
            return {"flushed": flushed, "live_requests": len(_State.scheduler.requests)}

    log.warning("kvwatch: probe on http://127.0.0.1:%d", port)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
