"""The service's settings: the web layer's groups added to the domain's.

The domain (:mod:`registry.settings`) holds what the core reads; the HTTP face's address, body and
connection limits, the access tokens, the MCP streams, the metrics bound and the log format live
here, as groups of their own. :class:`ServiceSettings` reads both from the same flat
``SHORTLIST_*`` variables, so a deployment's environment is read as it always was.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from registry.settings import Settings, SettingsGroup

# Comma-separated in the environment; SecretStr keeps every token out of reprs and logs.
Tokens = Annotated[tuple[SecretStr, ...], NoDecode]
HostNames = Annotated[tuple[str, ...], NoDecode]
# A JSON object {token: [tool name or pattern, ...]} in the environment, parsed by the validator
# below (never by pydantic-settings, whose errors would print the tokens).
TokenScopes = Annotated[tuple[tuple[SecretStr, tuple[str, ...]], ...], NoDecode]
_MALFORMED_SCOPES = "<not {token: [patterns]} JSON; value hidden>"


class HttpArgs(SettingsGroup):
    """HTTP face: address, body and connection limits (service.server, service.connection_guard, service.middleware)."""

    host: str = Field("127.0.0.1", description="Address the HTTP server binds.")
    port: int = Field(8080, ge=1, le=65535, description="Port the HTTP server listens on.")
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Largest request body (413 past it); the default takes a 10,000-tool registry of "
        "about 20 MB in one upload.",
    )
    max_feedback_body_bytes: int = Field(
        128 * 1024, ge=1024, description="Largest POST /feedback body (413 past it)."
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Largest request head (request line and header fields) in bytes; larger "
        "gets 431 and the connection is closed.",
    )
    max_header_count: int = Field(
        100, ge=8, le=10_000, description="Most header fields in one request; more gets 431."
    )
    header_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="A request head must arrive within this many seconds of the connection "
        "opening (or of the previous response); else 408 and the connection is closed.",
    )
    body_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="Longest pause while a request body is arriving; a body stalled longer "
        "gets 408 and the connection is closed.",
    )
    body_min_bytes_per_second: int = Field(
        1024,
        ge=1,
        description="Slowest average rate a request body may arrive at: a body still arriving "
        "body_timeout_seconds + (bytes received / this rate) seconds after its head gets 408 "
        "and the connection is closed, however steadily it trickles in.",
    )
    probe_connections: int = Field(
        16,
        ge=0,
        le=1024,
        description="Connections past max_connections kept for GET /healthz and /readyz, so "
        "probes answer while slow clients hold every slot; any other request on them gets 503.",
    )
    keep_alive_seconds: int = Field(
        5, ge=1, description="An idle keep-alive connection is closed after this many seconds."
    )
    max_connections: int = Field(
        2048,
        ge=1,
        description="Open connections per process; one more gets 503 and is closed at once "
        "(lowered to fit the open-file limit, whose soft value is raised to the hard one).",
    )
    worker_threads: int = Field(
        16, ge=1, le=1000, description="Requests handled at once (anyio worker threads); more only queue on the CPU "
        "and cost memory."
    )
    allowed_hosts: HostNames = Field(
        ("localhost", "127.0.0.1", "::1"),
        description="Host names (comma-separated, ports ignored) this server answers to; any "
        "other Host gets 421, and a request whose Origin names another host gets 403 (DNS "
        "rebinding). '*' answers every name: set it (or the names clients use) when the "
        "service is reached through a proxy, a load balancer or a container network.",
    )

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, (list, tuple)):
            return tuple(h.strip().lower().strip("[]") for h in value if str(h).strip())
        return value


class AuthArgs(SettingsGroup):
    """Access tokens: who may write, query and scrape (service.auth)."""

    admin_token: Tokens = Field(
        (),
        description="Bearer token(s), comma-separated, for registry writes (PUT/POST/DELETE "
        "/registries...); unset = writes are open.",
    )
    query_token: Tokens = Field(
        (),
        description="Bearer token(s), comma-separated, for POST /shortlist and /feedback (admin "
        "tokens work too); unset = queries are open.",
    )
    query_token_scopes: TokenScopes = Field(
        (),
        description="Tools a query token may be shown: a JSON object {token: [tool name or "
        "pattern, ...]} ('github/*', 'fs/read_*'). Each such token is a query token (added to "
        "SHORTLIST_QUERY_TOKEN); its shortlists (POST /shortlist, MCP find_tools) rank and cap "
        "only the tools its patterns match, and a request's allowed_tools can only narrow them.",
    )
    metrics_token: Tokens = Field(
        (),
        description="Bearer token(s), comma-separated, for GET /metrics (query and admin tokens "
        "work too). /metrics needs a token whenever any token is configured; open otherwise.",
    )

    @field_validator("admin_token", "query_token", "metrics_token", mode="before")
    @classmethod
    def _split_tokens(cls, value: object) -> object:
        # Never raise with the value in hand: a validation error would print the token.
        if isinstance(value, (str, SecretStr)):
            value = (value,)
        if isinstance(value, (list, tuple)):
            raw = (v.get_secret_value() if isinstance(v, SecretStr) else str(v) for v in value)
            return tuple(SecretStr(t.strip()) for v in raw for t in v.split(",") if t.strip())
        return value

    @field_validator("query_token_scopes", mode="before")
    @classmethod
    def _parse_scopes(cls, value: object) -> object:
        # Never raise with the value in hand: a bad value becomes a message without it.
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except ValueError:
                return _MALFORMED_SCOPES
        if isinstance(value, dict):
            value = list(value.items())
        if not isinstance(value, (list, tuple)):
            return _MALFORMED_SCOPES
        scopes = []
        for pair in value:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                return _MALFORMED_SCOPES
            token, patterns = pair
            token = token.get_secret_value() if isinstance(token, SecretStr) else token
            well_formed = isinstance(patterns, (list, tuple)) and patterns and all(
                isinstance(p, str) and p.strip() for p in patterns
            )
            if not (isinstance(token, str) and token.strip() and well_formed):
                return _MALFORMED_SCOPES
            scopes.append((SecretStr(token.strip()), tuple(patterns)))
        return tuple(scopes)


class McpArgs(SettingsGroup):
    """MCP face: event streams and the default registry (service.mcp)."""

    mcp_max_streams: int = Field(
        64,
        ge=1,
        description="Open GET /mcp event streams per process, counted apart from "
        "max_connections (an idle stream never takes a request's slot); one more gets 503 "
        "too_many_streams with Retry-After.",
    )
    mcp_stream_idle_seconds: float = Field(
        300.0,
        gt=0,
        description="A GET /mcp event stream that has sent no event (keep-alive comments aside) "
        "for this long is closed; the client may open another.",
    )
    default_registry: str = Field(
        "demo", description="Registry the MCP find_tools tool searches when a call names none."
    )


class MetricsArgs(SettingsGroup):
    """Metrics: the Prometheus label bound (service.metrics)."""

    metrics_max_registries: int = Field(
        100,
        ge=0,
        description="Registries with their own registry-labelled series on /metrics (the first "
        "this process loads or sees); the rest are summed under registry=\"~other\" and counted "
        "by shortlist_metrics_folded_registries, so a scrape stays small at any registry count.",
    )


class LoggingArgs(SettingsGroup):
    """Logging: the format of the log lines (service.logging_setup)."""

    log_format: Literal["text", "json"] = Field(
        "text",
        description="Log lines on stderr: 'text' (time level logger: message [request id]) or "
        "'json' (one object per line with ts, level, logger, message, request_id).",
    )


class ServiceSettings(HttpArgs, AuthArgs, McpArgs, MetricsArgs, LoggingArgs, Settings):
    """The web layer's configuration: its own groups, on top of every domain group."""

    model_config = SettingsConfigDict(env_prefix="SHORTLIST_", extra="ignore", frozen=False)

    @model_validator(mode="after")
    def _scoped_tokens_query(self) -> ServiceSettings:
        """A token bound to tool patterns is a query token: listing it once is enough."""
        known = {t.get_secret_value() for t in self.query_token}
        extra = tuple(t for t, _ in self.query_token_scopes if t.get_secret_value() not in known)
        if extra:
            self.query_token = (*self.query_token, *extra)
        return self

    def callers_required(self) -> bool:
        """Query tokens identify callers: usage learning then counts only events that name one."""
        return bool(self.query_token)
