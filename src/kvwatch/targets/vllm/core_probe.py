"""The audit served from inside vLLM's engine core, between engine steps.

kvwatch's vLLM plugin (``plugin.py``) calls ``install`` in the engine
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
    ``{"step": N, "waiting": W, "running": R, "audit": Audit as JSON,
    "checks": [Violation as JSON, ...], "registries": {path: entries}}``
    (``manager_audit.py``; W and R: the scheduler's queues; ``checks`` and
    ``registries``: ``checks.py``, the liveness findings among them those
    of every ``schedule()`` since the previous call, at most ``KEEP``)
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


KEEP = 64  # liveness findings kept between two audits


class _State:
    scheduler = None  # the engine core's scheduler, once built
    steps = 0
    liveness = None  # liveness.LivenessTracker, around every schedule()
    ledger = None  # hash_ledger.HashLedger, over the audits
    starved: tuple = ()  # liveness findings since the last audit


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
    Scheduler.schedule = _watched(Scheduler.schedule)
    threading.Thread(target=_serve, args=(port,), name="kvwatch-probe", daemon=True).start()


def _guarded(method, counts_steps: bool):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with LOCK:
            _State.steps += counts_steps
            return method(self, *args, **kwargs)

    return call


def _watched(schedule):
    """``schedule`` with the liveness check around it (``liveness.LivenessTracker``)."""
    from kvwatch.targets.vllm.hash_ledger import HashLedger
    from kvwatch.targets.vllm.liveness import LivenessTracker

    _State.liveness, _State.ledger = LivenessTracker(), HashLedger()

    @functools.wraps(schedule)
    def call(self, *args, **kwargs):
        _State.liveness.before(self)
        out = schedule(self, *args, **kwargs)
        found = _State.liveness.after(self, out)
        _State.starved = (*_State.starved, *found)[:KEEP]
        return out

    return call


def answer(scheduler, step: int, found) -> dict:
    """``GET /audit``'s answer: the audit of ``scheduler`` now, the checks' findings
    ``found``, the KV managers' registry sizes (the in-process driver answers alike)."""
    from kvwatch.targets.vllm.manager_audit import audit_scheduler
    from kvwatch.targets.vllm.scratch import registries

    return {
        "step": step,
        "waiting": len(scheduler.waiting),
        "running": len(scheduler.running),
        "audit": asdict(audit_scheduler(scheduler)),
        "checks": [asdict(f) for f in found],
        "registries": registries(scheduler),
    }


def checked(scheduler) -> dict:
    """``answer`` with the checks run now and the liveness findings since the last call."""
    from kvwatch.targets.vllm.hash_checks import check_hashes
    from kvwatch.targets.vllm.scratch import check_scratch

    found = check_hashes(scheduler) + check_scratch(scheduler)
    found += _State.ledger.observe(scheduler) if _State.ledger is not None else []
    found += list(_State.starved)
    _State.starved = ()
    return answer(scheduler, _State.steps, found)


def _serve(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

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
            return checked(_State.scheduler)

    @app.post("/flush")
    def flush():
        if (starting := ready()) is not None:
            return starting
        with LOCK:
            flushed = bool(_State.scheduler.reset_prefix_cache())
            return {"flushed": flushed, "live_requests": len(_State.scheduler.requests)}

    log.warning("kvwatch: probe on http://127.0.0.1:%d", port)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
