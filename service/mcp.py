"""The MCP face: ``/mcp`` (streamable HTTP) with two tools over the same core as the HTTP routes.

``find_tools`` returns a shortlist (structured content shaped like ``POST /shortlist``'s body,
plus a readable text block); ``report_tool_use`` records feedback like ``POST /feedback``.
The tool list is fixed: per-query shortlists travel in ``tools/call`` results, never in
``tools/list``. Stateless: any replica answers any request. Query tokens guard the endpoint as
they guard /shortlist and /feedback; failures come back as MCP tool errors (``isError``) whose
text starts with the service's error type and whose structured content is the HTTP error body.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from anyio import to_thread
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import JsonSchemaMode
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send

from registry.core import Shortlister
from registry.errors import ShortlistError
from registry.serving.depth_policies import MAX_DEPTH_BIAS
from registry.serving.shortlist import Shortlist
from registry.settings import Settings
from registry.writes.engine import MAX_K
from service.auth import authenticate, caller_hash
from service.errors import Unauthorized, error_body, error_response
from service.schemas import FeedbackRequest, FeedbackResponse, RegistryName, ShortlistResponse

log = logging.getLogger(__name__)

PATH = "/mcp"
INSTRUCTIONS = """Before acting on a request, call find_tools with the user's request (or your
current step) to get the few tools worth considering, with their full definitions. After the
task, call report_tool_use with the shortlist_id and the tools you used."""
_DESCRIPTION_CHARS = 160  # per tool in the text block; the full definition is structured


class FindToolsArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(
        min_length=1,
        description="The user's request (a whole message is fine) or the agent's current step. "
        "Several intents ('find X, then email it') are each covered.",
    )
    registry: RegistryName | None = Field(
        None, description="Registry to search (default: the server's default registry, 'demo')."
    )
    k: int | None = Field(
        None,
        ge=1,
        le=MAX_K,
        strict=True,
        description="Force a fixed number of tools (default: the learned depth policy chooses).",
    )
    depth_bias: float | None = Field(
        None,
        ge=-MAX_DEPTH_BIAS,
        le=MAX_DEPTH_BIAS,
        allow_inf_nan=False,
        description="Bits: > 0 gives longer lists (more often holds the tool), < 0 shorter.",
    )
    allow_empty: bool = Field(
        False, description="Allow an empty list when no tool fits (confidence says how sure)."
    )


def _schema(model: type[BaseModel], mode: JsonSchemaMode = "validation") -> dict[str, Any]:
    return model.model_json_schema(mode=mode)


TOOLS = [
    types.Tool(
        name="find_tools",
        title="Find the tools for a request",
        description="Shortlist the tools of a registry for a request: as many as a learned "
        "Bits-over-Random depth policy judges it needs, each with its full definition. Quote "
        "the shortlist_id in report_tool_use afterwards.",
        inputSchema=_schema(FindToolsArgs),
        outputSchema=_schema(ShortlistResponse, "serialization"),
        annotations=types.ToolAnnotations(readOnlyHint=True, openWorldHint=False),
    ),
    types.Tool(
        name="report_tool_use",
        title="Report which tools were used",
        description="Record which tools the agent used for a shortlist from find_tools (and "
        "optionally each call with whether it helped, and whether the task succeeded). A resend "
        "is not counted twice.",
        inputSchema=_schema(FeedbackRequest),
        outputSchema=_schema(FeedbackResponse, "serialization"),
        annotations=types.ToolAnnotations(idempotentHint=True, openWorldHint=False),
    ),
]


def _description(definition: dict[str, Any]) -> str:
    text = definition.get("description")
    function = definition.get("function")
    if not isinstance(text, str) and isinstance(function, dict):
        text = function.get("description")
    text = " ".join(text.split()) if isinstance(text, str) else ""
    return text if len(text) <= _DESCRIPTION_CHARS else text[: _DESCRIPTION_CHARS - 1] + "…"


def shortlist_text(result: Shortlist) -> str:
    """The readable block: one line per tool, then how to report use."""
    head = (
        f"{result.k} of {result.n_tools} tools from registry {result.registry!r} "
        f"(v{result.version}, policy {result.policy}, P_rand {result.p_rand:.3g}):"
    )
    lines = [head]
    if result.k == 0:
        sure = f" (confidence {result.confidence:.2f})" if result.confidence is not None else ""
        lines.append(f"no tool fits this request{sure}")
    for tool in result.tools:
        described = _description(tool.definition)
        lines.append(f"{tool.rank}. {tool.name}" + (f": {described}" if described else ""))
    lines.append(f"shortlist_id: {result.shortlist_id} (quote it in report_tool_use)")
    return "\n".join(lines)


def _error(error_type: str, message: str, details: Any = None) -> types.CallToolResult:
    body = error_body(error_type, message, details)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{error_type}: {message}")],
        structuredContent=body,
        isError=True,
    )


def _invalid(exc: ValidationError) -> types.CallToolResult:
    details = [
        {"field": ".".join(str(p) for p in err["loc"]), "message": err["msg"]}
        for err in exc.errors(include_url=False, include_input=False)
    ]
    summary = "; ".join(f"{d['field'] or 'arguments'}: {d['message']}" for d in details)
    return _error("validation", f"invalid arguments: {summary}", details)


class _Route(Route):
    """A route that names itself in the scope, as FastAPI's do (the HTTP counters' label)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match != Match.NONE:
            child["route"] = self
        return match, child


class McpFace:
    """The MCP server over one core; mount :meth:`route` and enter :meth:`running` at start-up."""

    def __init__(self, core: Shortlister, settings: Settings) -> None:
        self.core = core
        self.settings = settings
        self.server: Server[Any, Any] = Server(
            "tool-shortlist", version="0.1.0", instructions=INSTRUCTIONS
        )
        self.server.list_tools()(self._list_tools)
        # Arguments are validated here (pydantic), so errors carry the service's error type.
        self.server.call_tool(validate_input=False)(self._call_tool)
        loopback = settings.host in ("127.0.0.1", "localhost", "::1")
        security = TransportSecuritySettings(
            # As the SDK does for local servers: refuse other Host/Origin headers (DNS rebinding).
            enable_dns_rebinding_protection=loopback,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
        self._security = security
        self.sessions = self._session_manager()

    def _session_manager(self) -> StreamableHTTPSessionManager:
        return StreamableHTTPSessionManager(
            app=self.server, json_response=True, stateless=True, security_settings=self._security
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The session manager's task group, for the app's lifespan. A manager runs only once,
        so every lifespan (tests start one app's several times) gets a fresh one."""
        self.sessions = self._session_manager()
        async with self.sessions.run():
            yield

    def route(self) -> Route:
        """``/mcp`` served by this object as a plain ASGI app (every method)."""
        return _Route(PATH, endpoint=self, include_in_schema=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tokens = self.settings.query_token
        if tokens:
            headers = dict(scope.get("headers") or ())
            raw = headers.get(b"authorization")
            try:
                authenticate(
                    raw.decode("latin-1") if raw is not None else None,
                    (*tokens, *self.settings.admin_token),
                    "a query or admin token",
                )
            except Unauthorized as exc:
                response = error_response(401, exc.error_type, exc.message, exc.details)
                response.headers["WWW-Authenticate"] = exc.challenge
                await response(scope, receive, send)
                return
        await self.sessions.handle_request(scope, receive, send)

    async def _list_tools(self) -> list[types.Tool]:
        return TOOLS

    async def _call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        try:
            if name == "find_tools":
                return await self._find_tools(FindToolsArgs.model_validate(arguments))
            if name == "report_tool_use":
                return await self._report(FeedbackRequest.model_validate(arguments))
            return _error("not_found", f"unknown tool {name!r}", {"tool": name})
        except ValidationError as exc:
            return _invalid(exc)
        except ShortlistError as exc:
            return _error(exc.error_type, exc.message, exc.details)
        except Exception:
            log.exception("MCP tool %s failed", name)
            return _error("internal", "internal server error")

    def _caller(self) -> str | None:
        """Hash of the bearer token on the MCP request being handled (as on HTTP), so the
        learning loop counts MCP feedback per caller; None without tokens or a request."""
        try:
            request = self.server.request_context.request
        except LookupError:  # not inside a request (a direct call)
            return None
        headers = getattr(request, "headers", None)
        authorization = headers.get("authorization") if headers is not None else None
        return caller_hash(authorization, self.settings)

    async def _find_tools(self, args: FindToolsArgs) -> types.CallToolResult:
        caller = self._caller()

        def run() -> Shortlist:
            return self.core.shortlist(
                args.registry or self.settings.default_registry,
                args.query,
                k=args.k,
                depth_bias=args.depth_bias,
                allow_empty=args.allow_empty,
                caller=caller,
            )

        result = await to_thread.run_sync(run)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=shortlist_text(result))],
            structuredContent=result.to_json(),
        )

    async def _report(self, body: FeedbackRequest) -> types.CallToolResult:
        calls = [call.model_dump() for call in body.calls] if body.calls is not None else None
        caller = self._caller()

        def run() -> FeedbackResponse:
            return FeedbackResponse.of(
                self.core.feedback(body.shortlist_id, body.used, calls, body.success, caller=caller)
            )

        response = await to_thread.run_sync(run)
        data = response.model_dump(mode="json")
        verdict = "presented" if response.presented.exact else "not presented"
        text = (
            f"recorded for shortlist {response.shortlist_id} ({verdict}"
            f"{'; a resend, not counted again' if response.duplicate else ''})"
        )
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structuredContent=data
        )
