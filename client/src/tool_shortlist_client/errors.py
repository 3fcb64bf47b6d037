"""Exceptions: every error response becomes an :class:`APIError` carrying the service's
``{"error": {"type", "message", "details"}}``; a connection that never got an answer becomes a
:class:`TransportError`."""

from __future__ import annotations

from typing import Any

import httpx

_MAX_TEXT = 200  # a non-JSON error body (a proxy's page) is cut here in the message


class ShortlistClientError(Exception):
    """Base class of every exception this client raises."""


class ToolsFileError(ShortlistClientError, ValueError):
    """A tools file given to ``put_registry`` / ``upload_registry`` cannot be read or is not JSON
    (nothing was sent). The message names the file and, for bad JSON, the line and column."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot read the tools file {path}: {reason}")
        self.path = path
        self.reason = reason


class TransportError(ShortlistClientError):
    """No HTTP answer (connection refused, reset, timed out) after the allowed retries."""


class APIError(ShortlistClientError):
    """The service answered with an error status.

    Attributes:
        status_code: The HTTP status.
        error_type: The service's ``error.type`` (``not_found``, ``validation``, ``unauthorized``,
            ``unhealthy``, ...).
        message: The service's ``error.message``.
        details: The service's ``error.details`` (for ``validation``: a list of
            ``{"field", "message"}``), or ``None``.
    """

    def __init__(
        self,
        status_code: int,
        error_type: str,
        message: str,
        details: Any = None,
        *,
        headers: httpx.Headers | None = None,
    ) -> None:
        super().__init__(f"{status_code} {error_type}: {message}")
        self.status_code = status_code
        self.error_type = error_type
        self.message = message
        self.details = details
        self.headers = headers if headers is not None else httpx.Headers()

    @property
    def type(self) -> str:
        """Alias of :attr:`error_type` (the field's name in the error body)."""
        return self.error_type


class UnauthorizedError(APIError):
    """401: missing, malformed or unknown bearer token."""


class ForbiddenError(APIError):
    """403: the token is bound to tool patterns that match no tool of the registry asked."""


class NotFoundError(APIError):
    """404: unknown registry, tool or shortlist id (or an expired one)."""


class ConflictError(APIError):
    """409: another replica kept winning the race to write this registry."""


class PayloadTooLargeError(APIError):
    """413: body or registry too large."""


class UnsupportedMediaTypeError(APIError):
    """415: the body was not sent as JSON."""


class InvalidRequestError(APIError):
    """422: invalid input; ``details`` names every problem."""


class ServiceUnavailableError(APIError):
    """503: still loading, or storage unavailable."""


class ServerError(APIError):
    """Any other 5xx."""


_BY_STATUS: dict[int, type[APIError]] = {
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: InvalidRequestError,
    503: ServiceUnavailableError,
}


def error_from_response(response: httpx.Response) -> APIError:
    """The exception for an error response, read from the service's error body when it has one."""
    status = response.status_code
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else APIError)
    error_type, message, details = "http", response.reason_phrase or str(status), None
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("type"), str):
        error_type = error["type"]
        message = str(error.get("message", message))
        details = error.get("details")
    elif response.text:
        message = response.text[:_MAX_TEXT]
    return cls(status, error_type, message, details, headers=response.headers)


_STATUS_BY_TYPE = {"not_found": 404, "validation": 422, "payload_too_large": 413, "conflict": 409,
                   "unavailable": 503, "storage_full": 507, "superseded": 409}


def error_from_job(error: Any) -> APIError:
    """The exception for a failed write job (202 upload): its ``error`` body, status inferred."""
    error = error if isinstance(error, dict) else {}
    error_type = str(error.get("type", "internal"))
    status = _STATUS_BY_TYPE.get(error_type, 500)
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else APIError)
    return cls(status, error_type, str(error.get("message", "the write failed")), error.get("details"))
