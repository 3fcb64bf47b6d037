"""The one place where domain errors become HTTP responses: ``{"error": {type, message, details}}``."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from registry.errors import (
    ArtifactError,
    NotFound,
    NotReady,
    PayloadTooLarge,
    PolicySchemaMismatch,
    ScopeForbidden,
    ShortlistError,
    ShortlistExpired,
    StorageFull,
    StorageUnavailable,
    StoreUnavailable,
    ValidationFailed,
    VersionConflict,
)
from registry.job_queue import QueueFull

log = logging.getLogger(__name__)

STATUS_BY_ERROR: tuple[tuple[type[ShortlistError], int], ...] = (
    (QueueFull, 429),
    (ShortlistExpired, 410),
    (NotFound, 404),
    (ValidationFailed, 422),
    (ScopeForbidden, 403),
    (PayloadTooLarge, 413),
    (StoreUnavailable, 503),
    (StorageFull, 507),  # Insufficient Storage: the disk is full, nothing was changed
    (StorageUnavailable, 503),  # another I/O error
    (VersionConflict, 409),
    (ArtifactError, 503),
    (PolicySchemaMismatch, 503),
)


class Unauthorized(ShortlistError):
    """No valid bearer token for this route; ``challenge`` becomes the WWW-Authenticate header."""

    error_type = "unauthorized"

    def __init__(self, message: str, details: Any = None, *, challenge: str = "Bearer") -> None:
        super().__init__(message, details)
        self.challenge = challenge


class UnsupportedMediaType(ShortlistError):
    error_type = "unsupported_media_type"


SERVICE_STATUS: dict[type[ShortlistError], int] = {
    NotReady: 503,
    Unauthorized: 401,
    UnsupportedMediaType: 415,
}

_MAX_ECHOED_CHARS = 200  # client-chosen text (field names) echoed in an error is cut here


def invalid_body(exc: BaseException | str) -> ValidationFailed:
    """The 422 for a body that is not decodable JSON (bad syntax, not UTF-8, nested too deep)."""
    if isinstance(exc, RecursionError):
        reason = "it is nested too deeply"
    elif isinstance(exc, UnicodeDecodeError):
        reason = f"it is not UTF-8 ({exc.reason} at byte {exc.start})"
    else:
        reason = str(exc)[:_MAX_ECHOED_CHARS]
    message = f"request body is not valid JSON: {reason}"
    return ValidationFailed(message, [{"field": "body", "message": message}])


_COUNTED_PROBLEMS = re.compile(r"\d+ problem\(s\)$")
_PROBLEMS_IN_MESSAGE = 5
MAX_PROBLEMS = 50
"""Problems listed in a 422's ``details``; the rest are counted in a last entry. A body of a
million bad keys must not get an answer larger than itself."""


def bounded_problems(details: Any, total: int | None = None) -> Any:
    """At most :data:`MAX_PROBLEMS` problems, each string in them cut to 200 characters, and a
    last entry counting the ones left out (``omitted``; ``total``: how many there were, when
    ``details`` lists only the first)."""
    if not isinstance(details, list):
        return details
    kept = [
        {k: v[:_MAX_ECHOED_CHARS] if isinstance(v, str) else v for k, v in d.items()}
        if isinstance(d, dict)
        else d
        for d in details[:MAX_PROBLEMS]
    ]
    omitted = (len(details) if total is None else total) - len(kept)
    if omitted > 0:
        kept.append(
            {
                "field": "",
                "message": f"{omitted} more problem(s) not listed (the first {MAX_PROBLEMS} are)",
                "omitted": omitted,
            }
        )
    return kept


def with_problems(message: str, details: Any) -> str:
    """``message`` with its problems spelled out when it only counts them ("invalid feedback: 2
    problem(s)" becomes "... problem(s): used[0]: tool 'x' does not exist ...; success: ...");
    the first five, then how many more. ``details`` keeps the full list."""
    if not _COUNTED_PROBLEMS.search(message) or not isinstance(details, list):
        return message
    parts = [
        f"{d.get('field') or 'body'}: {d.get('message')}"
        for d in details
        if isinstance(d, dict) and d.get("message")
    ]
    if not parts:
        return message
    more = len(parts) - _PROBLEMS_IN_MESSAGE
    shown = "; ".join(p[:_MAX_ECHOED_CHARS] for p in parts[:_PROBLEMS_IN_MESSAGE])
    return f"{message}: {shown}" + (f" (and {more} more)" if more > 0 else "")


def error_body(error_type: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"type": error_type, "message": message, "details": details}}


class ErrorJSONResponse(JSONResponse):
    """An error body in ASCII JSON: it may quote the client's input back, and that input can hold
    characters UTF-8 cannot encode (a lone surrogate sent as ``"\\ud800"``); ``\\uXXXX``
    escapes carry them without failing."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode(
            "ascii"
        )


def error_response(status: int, error_type: str, message: str, details: Any = None) -> JSONResponse:
    return ErrorJSONResponse(error_body(error_type, message, details), status_code=status)


def status_for(exc: ShortlistError) -> int:
    for cls, status in (*SERVICE_STATUS.items(), *STATUS_BY_ERROR):
        if isinstance(exc, cls):
            return status
    return 500


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ShortlistError)
    async def _domain(_: Request, exc: ShortlistError) -> JSONResponse:
        status = status_for(exc)
        if status == 500:
            log.error("unmapped domain error", exc_info=exc)
        details = exc.details
        message = exc.message
        if status == 422:
            message = with_problems(exc.message, details)
            details = bounded_problems(details)
        response = error_response(status, exc.error_type, message, details)
        if isinstance(exc, Unauthorized):
            response.headers["WWW-Authenticate"] = exc.challenge
        if isinstance(exc, QueueFull):
            response.headers["Retry-After"] = str(exc.retry_after)
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        for err in exc.errors():
            if err.get("type") == "json_invalid":  # FastAPI's parser: say it as the routes do
                reason = (err.get("ctx") or {}).get("error", "decode error")
                where = err.get("loc", ("body", "?"))[-1]
                return await _domain(request, invalid_body(f"{reason} at character {where}"))
        errors = exc.errors()
        details = [
            {
                "field": ".".join(str(part) for part in err.get("loc", ()) if part != "body")[
                    :_MAX_ECHOED_CHARS
                ],
                "message": str(err.get("msg", "invalid"))[:_MAX_ECHOED_CHARS],
            }
            for err in errors[:MAX_PROBLEMS]
        ]
        summary = "; ".join(f"{d['field'] or 'body'}: {d['message']}" for d in details[:_PROBLEMS_IN_MESSAGE])
        more = len(errors) - min(len(details), _PROBLEMS_IN_MESSAGE)
        summary += f" (and {more} more)" if more > 0 else ""
        details = bounded_problems(details, total=len(errors))
        return error_response(422, "validation", f"invalid request: {summary}", details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, (ValueError, RecursionError)):
            # FastAPI's body parser gives a bare 400 when the body is not UTF-8 or nests too deep.
            return await _domain(request, invalid_body(exc.__cause__))
        error_type = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status_code, "http"
        )
        response = error_response(exc.status_code, error_type, str(exc.detail))
        response.headers.update(exc.headers or {})  # e.g. Allow on a 405
        return response

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return error_response(500, "internal", "internal server error")
