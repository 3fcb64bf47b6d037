"""Pure-ASGI middleware: request ids, Host and Origin checks, a token check before the body is
read, the request-body size limit and per-route HTTP counters."""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import urlsplit

from pydantic import SecretStr
from starlette.datastructures import MutableHeaders
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth import authenticate
from service.errors import Unauthorized, error_body, error_response
from service.logging_setup import REQUEST_ID, REQUEST_ID_HEADER, accept_request_id
from service.mcp_http import replay
from service.metrics import Metrics
from service.settings import ServiceSettings


class RequestIdMiddleware:
    """Give every request an id and return it as ``X-Request-ID`` on every response.

    A sane incoming ``X-Request-ID`` (see :func:`accept_request_id`) is kept, so a caller's id
    follows the request into our logs; otherwise a new one is made. The id is in
    :data:`REQUEST_ID` while the request is handled, so every log line carries it. Installed
    outermost: a 413 from :class:`BodyLimitMiddleware` has it, and so does the 500 of an
    unexpected exception (Starlette's outer error middleware would answer without it).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope.get("headers") or ()).get(REQUEST_ID_HEADER.lower().encode())
        request_id = accept_request_id(incoming.decode("latin-1") if incoming else None)
        token = REQUEST_ID.set(request_id)
        started = False

        async def with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        try:
            await self.app(scope, receive, with_id)
        except Exception:
            if not started:  # the outer error middleware logs and re-raises; we answer
                await error_response(500, "internal", "internal server error")(scope, receive, with_id)
            raise  # REQUEST_ID stays set: the outer handler's log line carries it
        REQUEST_ID.reset(token)


def host_name(value: str) -> str:
    """``Example.COM:8080`` -> ``example.com``, ``[::1]:80`` -> ``::1`` (a Host header's name)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    return value.rpartition(":")[0] if value.count(":") == 1 else value


class HostGuardMiddleware:
    """Refuse requests addressed to a host name this server does not answer to (421), and
    requests a browser sent from a page of another host (``Origin``; 403): with both, a web
    page cannot reach a server on localhost through DNS rebinding, on any route.

    ``allowed`` holds host names without ports (``SHORTLIST_ALLOWED_HOSTS``); ``*`` in it
    turns both checks off (a service behind a proxy, reached by names it cannot list).
    """

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = frozenset(allowed)
        self.open = "*" in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.open:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        host = host_name(headers.get(b"host", b"").decode("latin-1"))
        # No Host at all (HTTP/1.0 health checkers) is no rebinding: a browser always sends one.
        if host and host not in self.allowed:
            response = error_response(
                421, "misdirected_request",
                f"this server does not answer to host {host[:100]!r} (SHORTLIST_ALLOWED_HOSTS)",
                {"host": host[:100]},
            )
            await response(scope, receive, send)
            return
        origin = headers.get(b"origin")
        if origin is not None and origin != b"null":
            origin_host = host_name(urlsplit(origin.decode("latin-1")).netloc)
            if origin_host not in self.allowed:
                response = error_response(
                    403, "forbidden_origin",
                    f"requests from pages of {origin_host[:100]!r} are refused "
                    "(SHORTLIST_ALLOWED_HOSTS)",
                    {"origin": origin_host[:100]},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class EarlyAuthMiddleware:
    """Check the bearer token of a request with a body before reading the body: a client with
    no token cannot hold a connection (and a worker) by sending a slow body; it gets 401 at
    once and the connection is closed.

    A coarse first check: any token that opens some route of the path passes (the route's own
    dependency then applies the exact rule of :mod:`service.auth`).
    """

    QUERY_PATHS = ("/shortlist", "/feedback", "/mcp")
    BODY_METHODS = ("POST", "PUT", "PATCH")

    def __init__(self, app: ASGIApp, settings: ServiceSettings) -> None:
        self.app = app
        both = (*settings.query_token, *settings.admin_token)
        self.query: tuple[SecretStr, ...] = both if settings.query_token else ()
        self.admin: tuple[SecretStr, ...] = both if settings.admin_token else ()

    def _needed(self, path: str) -> tuple[tuple[SecretStr, ...], str]:
        if path in self.QUERY_PATHS:
            return self.query, "a query or admin token"
        if path.startswith("/registries"):
            return self.admin, "an admin token"
        return (), ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.BODY_METHODS:
            await self.app(scope, receive, send)
            return
        accepted, needs = self._needed(scope.get("path", ""))
        if accepted:
            raw = dict(scope.get("headers") or ()).get(b"authorization")
            try:
                authenticate(raw.decode("latin-1") if raw is not None else None, accepted, needs)
            except Unauthorized as exc:
                response = error_response(401, exc.error_type, exc.message, exc.details)
                response.headers["WWW-Authenticate"] = exc.challenge
                response.headers["Connection"] = "close"  # the unread body is never read
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


_BODY_SETTING = "SHORTLIST_MAX_BODY_BYTES"


class BodyLimitMiddleware:
    """Reject request bodies above ``max_bytes`` with 413 before the app sees them.

    ``path_limits`` sets a smaller limit on some paths, as ``{path: (bytes, setting name)}``:
    a feedback report is a few hundred bytes, a registry upload may be megabytes.
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int, path_limits: dict[str, tuple[int, str]] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit, setting = self.path_limits.get(scope.get("path", ""), (self.max_bytes, _BODY_SETTING))
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._reject(send, int(declared), limit, setting)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._reject(send, size, limit, setting)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, replay(b"".join(chunks), receive), send)

    async def _reject(self, send: Send, size: int, limit: int, setting: str) -> None:
        payload = error_body(
            "payload_too_large",
            f"request body is larger than the limit of {limit} bytes ({setting})",
            {"field": "body", "limit_bytes": limit, "received_bytes_at_least": size},
        )
        data = json.dumps(payload, allow_nan=False).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})


class HttpMetricsMiddleware:
    """Count requests by method, route template (never the raw path) and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope.get("route")
            template = route.path if isinstance(route, (Route, Mount)) and route.path else "unmatched"
            self.metrics.http_requests.labels(scope["method"], template, str(status)).inc()
