"""Streaming-session endpoints: open, close, rollback and trajectory.

A session's turns go through the completion endpoints with ``session_id``.
For ``/v1/chat/completions`` a turn carries only its new messages; the
server appends them to the session's tokens. For ``/v1/completions`` the
prompt is the whole sequence and must extend the session's tokens.
Every call that finds its session counts as a use for the idle timeout
(idle.py; the clock hears of turns from the engine's events).
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Request

from kvwatch.engine.engine import Engine
from kvwatch.server.bodies import ID_PATTERN, SessionOpen, SessionRollback
from kvwatch.server.http_errors import ApiError
from kvwatch.server.idle import SessionClock
from kvwatch.server.worker import EngineWorker

router = APIRouter()


def _worker(request: Request) -> EngineWorker:
    return request.app.state.worker


def _clock(request: Request) -> SessionClock:
    return request.app.state.clock


def _session_info(engine: Engine, session_id: str) -> dict:
    info = engine.session_info(session_id)
    return {
        "id": info.session_id,
        "object": "session",
        "tokens": info.tokens,
        "turns": info.turns,
        "record": info.record,
        "routed_experts": info.routed_experts,
    }


@router.post("/v1/sessions")
async def open_session(request: Request, body: SessionOpen | None = None):
    body = body or SessionOpen()
    worker = _worker(request)

    def open_() -> dict:
        sid = worker.engine.open_session(
            body.session_id, record=body.record, routed_experts=body.routed_experts
        )
        return _session_info(worker.engine, sid)

    info = await worker.run(open_)
    _clock(request).opened(info["id"])
    return info


@router.get("/v1/sessions/{session_id}")
async def get_session(request: Request, session_id: str):
    """The session, with ``token_ids``: the conversation its next turn must start with
    (a turn cut after it ran stays in it, and its client may not have seen all of it)."""
    worker = _worker(request)

    def read(sid: str) -> dict:
        return {**_session_info(worker.engine, sid), "token_ids": worker.engine.session_tokens(sid)}

    info = await worker.run(read, _checked(session_id))
    _clock(request).touch(session_id)
    return info


@router.delete("/v1/sessions/{session_id}")
async def close_session(request: Request, session_id: str):
    worker = _worker(request)
    await worker.run(worker.engine.close_session, _checked(session_id))
    _clock(request).forget(session_id)
    return {"id": session_id, "object": "session", "closed": True}


@router.post("/v1/sessions/{session_id}/rollback")
async def rollback(request: Request, session_id: str, body: SessionRollback | None = None):
    body = body or SessionRollback()
    worker = _worker(request)

    def roll() -> dict:
        worker.engine.rollback_session(_checked(session_id), body.steps)
        return _session_info(worker.engine, session_id)

    info = await worker.run(roll)
    _clock(request).touch(session_id)
    return info


@router.get("/v1/sessions/{session_id}/trajectory")
async def trajectory(request: Request, session_id: str):
    worker = _worker(request)
    traj = await worker.run(worker.engine.trajectory, _checked(session_id))
    _clock(request).touch(session_id)
    experts = traj.routed_experts
    return {
        "id": session_id,
        "object": "session.trajectory",
        "token_ids": traj.token_ids,
        "loss_mask": traj.loss_mask,
        "logprobs": traj.logprobs,
        "routed_experts": experts.tolist() if experts is not None else None,
    }


def _checked(session_id: str) -> str:
    if not re.fullmatch(ID_PATTERN, session_id):
        raise ApiError(400, f"malformed session id {session_id[:64]!r}", code="invalid_session_id")
    return session_id
