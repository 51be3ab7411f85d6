"""OpenAI-style error bodies, and the handlers that turn every failure into one.

Every error a client can cause answers ``{"error": {"message", "type",
"param", "code"}}`` with a 4xx status and a non-empty code; only a bug
answers 500, and in the same shape (code ``internal_error``). The engine's
errors carry a kind, never a status: ``STATUS`` below is the one place that
turns a kind into an HTTP status.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from kvwatch.engine.errors import EngineError, ErrorKind
from kvwatch.server.worker import EngineStopped

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    431: "invalid_request_error",
}
# The HTTP status of each kind of engine error.
STATUS: Mapping[ErrorKind, int] = {
    ErrorKind.INVALID: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
}
# Codes for the errors Starlette raises itself (no route, wrong method, ...).
HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def error_body(status: int, message: str, *, code: str | None = None, param: str | None = None):
    return {
        "error": {
            "message": message,
            "type": TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(status: int, message: str, **kw) -> JSONResponse:
    return JSONResponse(error_body(status, message, **kw), status_code=status)


class ApiError(Exception):
    """Raised by handlers for a client error that is not a validation failure."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param=None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        what = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            return error_response(400, "the request body is not valid JSON", code="invalid_json")
        if not loc and first.get("type") in ("model_attributes_type", "dict_type", "missing"):
            message = "the request body must be a JSON object (Content-Type: application/json)"
            return error_response(400, message, code="invalid_body")
        param = ".".join(loc) or None
        message = f"{param}: {what}" if param else what
        return error_response(400, message, code="invalid_value", param=param)

    @app.exception_handler(EngineError)
    async def _engine(request: Request, exc: EngineError) -> JSONResponse:
        return error_response(STATUS[exc.kind], str(exc), code=exc.code)

    @app.exception_handler(EngineStopped)
    async def _stopped(request: Request, exc: EngineStopped) -> JSONResponse:
        return error_response(503, str(exc), code="engine_stopped")

    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, code=exc.code, param=exc.param)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not parse the body
            return error_response(400, _unparsable(exc.__cause__), code="invalid_json")
        code = HTTP_CODES.get(exc.status_code, "http_error")
        body = error_body(exc.status_code, str(exc.detail), code=code)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        message = f"internal error ({type(exc).__name__}); see the server log"
        return error_response(500, message, code="internal_error")


def _unparsable(cause: BaseException) -> str:
    if isinstance(cause, UnicodeDecodeError):
        return "the request body is not valid UTF-8"
    if isinstance(cause, RecursionError):
        return "the request body nests too deeply"
    return "the request body is not valid JSON"
