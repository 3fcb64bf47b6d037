"""The HTTP server: uvicorn configured from :class:`ServiceSettings`, with the connection limits
uvicorn lacks (:mod:`service.connection_guard`), a descriptor cap and a redacted access log.

``shortlist serve`` and the end-to-end tests both start the server through :func:`serve`.
"""

from __future__ import annotations

import dataclasses
import logging
import resource
from typing import Any

import uvicorn

from service.connection_guard import ConnectionLimits, protocol_class
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

FD_RESERVE = 128
"""Descriptors kept free beyond the connection cap (data files, Redis, the model, logs)."""


# -- access log ------------------------------------------------------------------------------

REDACTED_QUERY = "***"


def redact_query(target: str) -> str:
    """``/p?token=abc&x=1`` -> ``/p?***``: the whole query string goes, since a token may be
    sent as a value, a bare ``?<token>`` or a parameter name alike."""
    path, sep, query = target.partition("?")
    return path + sep + REDACTED_QUERY if sep and query else target


class RedactQueryFilter(logging.Filter):
    """Redacts the query string in uvicorn's access log (a token sent in the URL)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn.access: (client, method, path with query string, http version, status)
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def install_access_log_filter() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQueryFilter) for f in access.filters):
        access.addFilter(RedactQueryFilter())


# -- descriptors and the server ----------------------------------------------------------------


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft


def connection_cap(settings: ServiceSettings, fd_limit: int) -> int:
    """``max_connections``, lowered (with a warning) to what the descriptor limit allows once
    the MCP streams' own bound is kept free."""
    cap = settings.max_connections
    reserve = FD_RESERVE + settings.mcp_max_streams
    room = fd_limit - reserve if fd_limit != resource.RLIM_INFINITY else cap
    if room < cap:
        log.warning(
            "SHORTLIST_MAX_CONNECTIONS=%d does not fit the open-file limit %d: capped at %d",
            cap, fd_limit, max(room, 1),
        )
        cap = max(room, 1)
    return cap


def uvicorn_config(app: Any, settings: ServiceSettings, *, log_level: str = "info") -> uvicorn.Config:
    """The uvicorn configuration ``shortlist serve`` runs: explicit parser, limits, timeouts."""
    cap = connection_cap(settings, raise_fd_limit())
    limits = dataclasses.replace(ConnectionLimits.of(settings), max_connections=cap)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=protocol_class(limits),
        ws="none",  # no WebSocket routes: no upgrade path to guard
        log_level=log_level,
        log_config=None,  # no handlers of uvicorn's own: service.logging_setup formats its lines
        # Connections never exceed the cap plus the open streams (refused at connect); uvicorn's
        # check, which counts the asking connection and every running task (a stream is one),
        # then answers 503 while `cap` requests are still running (a request outlives a client
        # that hung up).
        limit_concurrency=cap + settings.mcp_max_streams + settings.probe_connections + 1,
        timeout_keep_alive=settings.keep_alive_seconds,
        h11_max_incomplete_event_size=settings.max_header_bytes,
    )
    install_access_log_filter()
    return config


def serve(app: Any, settings: ServiceSettings, *, log_level: str = "info") -> None:
    """Run ``app`` until interrupted, with :func:`uvicorn_config`."""
    uvicorn.Server(uvicorn_config(app, settings, log_level=log_level)).run()
