"""The one place where domain errors become HTTP responses: ``{"error": {type, message, details}}``."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from registry.errors import (
    ArtifactError,
    NotFound,
    PayloadTooLarge,
    PolicySchemaMismatch,
    ShortlistError,
    StoreUnavailable,
    ValidationFailed,
)

log = logging.getLogger(__name__)

STATUS_BY_ERROR: tuple[tuple[type[ShortlistError], int], ...] = (
    (NotFound, 404),
    (ValidationFailed, 422),
    (PayloadTooLarge, 413),
    (StoreUnavailable, 503),
    (ArtifactError, 503),
    (PolicySchemaMismatch, 503),
)


class NotReady(ShortlistError):
    error_type = "unhealthy"


def error_body(error_type: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"type": error_type, "message": message, "details": details}}


def error_response(status: int, error_type: str, message: str, details: Any = None) -> JSONResponse:
    return JSONResponse(error_body(error_type, message, details), status_code=status)


def status_for(exc: ShortlistError) -> int:
    if isinstance(exc, NotReady):
        return 503
    for cls, status in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return status
    return 500


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ShortlistError)
    async def _domain(_: Request, exc: ShortlistError) -> JSONResponse:
        status = status_for(exc)
        if status >= 500 and status != 503:
            log.error("unmapped domain error", exc_info=exc)
        return error_response(status, exc.error_type, exc.message, exc.details)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {
                "field": ".".join(str(part) for part in err.get("loc", ()) if part != "body"),
                "message": err.get("msg", "invalid"),
            }
            for err in exc.errors()
        ]
        summary = "; ".join(f"{d['field'] or 'body'}: {d['message']}" for d in details)
        return error_response(422, "validation", f"invalid request: {summary}", details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        error_type = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status_code, "http"
        )
        return error_response(exc.status_code, error_type, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return error_response(500, "internal", "internal server error")
