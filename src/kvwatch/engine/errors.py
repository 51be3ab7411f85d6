"""Errors a caller can cause, each with the kind of mistake it is.

The engine says *what* went wrong (``ErrorKind``) and a stable ``code``; it
knows nothing of HTTP. A server maps kinds to statuses in one table
(``kvwatch.server.http_errors.STATUS``).
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    INVALID = "invalid"  # the call itself is wrong: bad input, a value out of range
    NOT_FOUND = "not_found"  # it names something the engine never had
    CONFLICT = "conflict"  # a fine call at the wrong moment: busy, closed or already taken


class EngineError(ValueError):
    """A call the engine refuses; nothing in the engine changed."""

    kind = ErrorKind.INVALID
    code = "invalid_request"

    def __init__(self, message: str, *, kind: ErrorKind | None = None, code: str | None = None):
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        if code is not None:
            self.code = code


class SessionError(EngineError):
    code = "session_error"


def invalid_prompt(message: str) -> EngineError:
    return EngineError(message, code="invalid_prompt")


def unknown_session(session_id: str) -> SessionError:
    return SessionError(
        f"session {session_id!r} does not exist",
        kind=ErrorKind.NOT_FOUND,
        code="session_not_found",
    )


def closed_session(session_id: str) -> SessionError:
    return SessionError(
        f"session {session_id!r} is closed", kind=ErrorKind.CONFLICT, code="session_closed"
    )


def busy_session(session_id: str) -> SessionError:
    return SessionError(
        f"session {session_id!r} already has a turn in flight",
        kind=ErrorKind.CONFLICT,
        code="session_busy",
    )
