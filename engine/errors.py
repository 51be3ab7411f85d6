"""Errors a caller can cause, with the HTTP status a server should answer."""

from __future__ import annotations


class EngineError(ValueError):
    """A request the engine refuses; nothing in the engine changed."""

    status = 400
    code = "invalid_request"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class SessionError(EngineError):
    code = "session_error"


def unknown_session(session_id: str) -> SessionError:
    return SessionError(
        f"session {session_id!r} does not exist", status=404, code="session_not_found"
    )


def closed_session(session_id: str) -> SessionError:
    return SessionError(f"session {session_id!r} is closed", status=409, code="session_closed")


def busy_session(session_id: str) -> SessionError:
    return SessionError(
        f"session {session_id!r} already has a turn in flight", status=409, code="session_busy"
    )
