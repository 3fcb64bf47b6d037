"""Logging for the ``shortlist`` command, set up in one place.

- One stderr handler on the root logger, in ``text`` (human) or ``json`` (one object per line)
  format; uvicorn's loggers propagate to it instead of keeping their own handlers.
- Import noise stays out: ``faiss.loader`` reports every CPU-specific build it fails to load at
  INFO (``ModuleNotFoundError`` lines that read like errors) and ``bm25s`` sets its own logger to
  DEBUG when imported. Both are held at WARNING by a handler filter, whatever the import order.
- A request id (:data:`REQUEST_ID`, set by :class:`service.middleware.RequestIdMiddleware`) is
  added to every line logged while a request is handled.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO, Any, Final, Literal

LogFormat = Literal["text", "json"]

REQUEST_ID: ContextVar[str | None] = ContextVar("shortlist_request_id", default=None)
"""The id of the request being handled in this context (None outside a request)."""

REQUEST_ID_HEADER: Final = "X-Request-ID"
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._~:;=+/@-]{1,128}")

# Loggers whose INFO/DEBUG records are import-time or per-build chatter, not operations.
QUIET_LOGGERS: Final[tuple[str, ...]] = (
    "faiss.loader",
    "faiss",
    "bm25s",
    # The MCP SDK logs per request at INFO (2.x: "Terminating session: None" for every
    # stateless POST; 1.x: "Processing request of type ..."), and its session manager's start
    # and stop: per-call chatter. Its warnings still pass.
    "mcp",
)
UVICORN_LOGGERS: Final[tuple[str, ...]] = ("uvicorn", "uvicorn.error", "uvicorn.access")
# uvicorn's lifecycle chatter at INFO ("Uvicorn running on ..." and "Shutting down" stay).
_UVICORN_CHATTER: Final[tuple[str, ...]] = (
    "Started server process",
    "Waiting for application startup",
    "Application startup complete",
    "Waiting for application shutdown",
    "Application shutdown complete",
    "Finished server process",
)
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def accept_request_id(value: str | None) -> str:
    """``value`` if it is a sane request id (1-128 printable, no spaces or quotes), else a new one."""
    if value and _SANE_REQUEST_ID.fullmatch(value):
        return value
    return uuid.uuid4().hex


class QuietImports(logging.Filter):
    """Drops records below WARNING from :data:`QUIET_LOGGERS` (and their children), and
    uvicorn's start/stop chatter at INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        name = record.name
        if name == "uvicorn.error" and record.levelno == logging.INFO:
            return not str(record.msg).startswith(_UVICORN_CHATTER)
        return not any(name == quiet or name.startswith(quiet + ".") for quiet in QUIET_LOGGERS)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``, with ``[request_id]`` appended inside a request."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = REQUEST_ID.get()
        return f"{line} [{request_id}]" if request_id else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message``, ``request_id``
    (inside a request), ``exc`` (with a traceback) and, for uvicorn's access lines, ``client``,
    ``method``, ``path`` and ``status``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = REQUEST_ID.get()
        if request_id:
            out["request_id"] = request_id
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            client, method, path, _version, status = args
            out.update(client=client, method=method, path=path, status=status)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class _ShortlistHandler(logging.StreamHandler):
    """Marks the handler this module installed, so a second set-up replaces it."""


def configure_logging(
    level: str | int = "info", log_format: LogFormat = "text", stream: IO[str] | None = None
) -> logging.Handler:
    """Send every log record at ``level`` or above to ``stream`` (stderr) in ``log_format``.

    Safe to call twice (the earlier handler is replaced). Returns the handler installed.
    """
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _ShortlistHandler)]:
        root.removeHandler(old)
    handler = _ShortlistHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(QuietImports())
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in QUIET_LOGGERS:  # bm25s resets its level at import; the filter covers that
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in UVICORN_LOGGERS:  # uvicorn's own handlers would bypass the format
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True
    return handler
