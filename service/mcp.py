"""The MCP face: ``/mcp`` (streamable HTTP, MCP Python SDK 2.x) with two tools over the same core
as the HTTP routes.

``find_tools`` returns a shortlist: structured content shaped like ``POST /shortlist``'s body,
the same JSON serialised in a text block (as the spec asks of a tool with structured content),
and a readable summary; ``report_tool_use`` records feedback like ``POST /feedback``.
The tool list is fixed: per-query shortlists travel in ``tools/call`` results, never in
``tools/list``. Stateless: any replica answers any request. Query tokens guard the endpoint as
they guard /shortlist and /feedback; failures come back as MCP tool errors (``isError``) whose
text starts with the service's error type and whose structured content is the HTTP error body.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from anyio import to_thread
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.json_schema import JsonSchemaMode
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Message, Receive, Scope, Send

from registry.core import Shortlister
from registry.errors import ShortlistError
from registry.request import MAX_QUERIES, ShortlistRequest
from registry.serving.result import Shortlist
from service import json_body
from service.auth import CALLER_HEADER, authenticate, caller_hash, token_scope
from service.errors import Unauthorized, error_body, error_response
from service.mcp_http import invalid_request, json_errors, read_body, replay
from service.schemas import (
    FeedbackRequest,
    FeedbackResponse,
    RequestFields,
    ShortlistResponse,
    request_field,
    request_model,
    request_value,
)
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

PATH = "/mcp"
INSTRUCTIONS = """Before acting on a request, call find_tools with the user's request (or your
current step) to get the few tools worth considering, with their full definitions. After the
task, call report_tool_use with the shortlist_id and the tools you used."""
_DESCRIPTION_CHARS = 160  # per tool in the text block; the full definition is structured
STREAM_RETRY_AFTER_SECONDS = 30  # told to a client refused a stream (all slots are taken)


class FindToolsFields(RequestFields):
    model_config = ConfigDict(extra="forbid")

    def to_request(self, default_registry: str) -> ShortlistRequest:
        """The domain's request: ``limit`` folded into ``max_k`` (the smaller cap wins), the
        server's default registry when none is named."""
        fields = self.model_dump()
        caps = [cap for cap in (fields.pop("max_k"), fields.pop("limit")) if cap is not None]
        fields["max_k"] = min(caps) if caps else None
        fields["registry"] = fields["registry"] or default_registry
        return request_value(fields)


# find_tools' arguments: the request fields a model chooses (the scorer and the policy are the
# server's), the registry optional, and ``limit`` (langgraph-bigtool's name for a cap).
_LIMIT = request_field(
    "max_k", doc="Same as max_k (the name models often use): a cap, never a fixed count."
)
if TYPE_CHECKING:
    FindToolsArgs = FindToolsFields
else:
    FindToolsArgs = request_model(
        "FindToolsArgs",
        FindToolsFields,
        ("query", "queries", "allowed_tools", "k", "max_k", "depth_bias", "allow_empty", "called"),
        registry=request_field("registry", default=None),
        limit=_LIMIT,
    )


def _schema(model: type[BaseModel], mode: JsonSchemaMode = "validation") -> dict[str, Any]:
    return model.model_json_schema(mode=mode)


TOOLS = [
    types.Tool(
        name="find_tools",
        title="Find the tools for a request",
        description="Shortlist the tools of a registry for a request (or up to "
        f"{MAX_QUERIES} requests at once): as many as a learned Bits-over-Random depth policy "
        "judges it needs, each with its full definition, only among allowed_tools when given "
        "(registry: the server's default registry when left out). Quote the shortlist_id in "
        "report_tool_use afterwards.",
        input_schema=_schema(FindToolsArgs),
        output_schema=_schema(ShortlistResponse, "serialization"),
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    ),
    types.Tool(
        name="report_tool_use",
        title="Report which tools were used",
        description="Record which tools the agent used for a shortlist from find_tools (and "
        "optionally each call with whether it helped, and whether the task succeeded). A resend "
        "is not counted twice.",
        input_schema=_schema(FeedbackRequest),
        output_schema=_schema(FeedbackResponse, "serialization"),
        annotations=types.ToolAnnotations(idempotent_hint=True, open_world_hint=False),
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
        asked = f" [queries {', '.join(map(str, tool.queries))}]" if tool.queries is not None else ""
        lines.append(f"{tool.rank}. {tool.name}{asked}" + (f": {described}" if described else ""))
    lines.append(f"shortlist_id: {result.shortlist_id} (quote it in report_tool_use)")
    return "\n".join(lines)


def _error(error_type: str, message: str, details: Any = None) -> types.CallToolResult:
    body = error_body(error_type, message, details)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{error_type}: {message}")],
        structured_content=body,
        is_error=True,
    )


def _structured(data: dict[str, Any], summary: str) -> types.CallToolResult:
    """Structured content, its JSON as the first text block, then the readable summary."""
    return types.CallToolResult(
        content=[
            types.TextContent(type="text", text=json_body.dumps(data)),
            types.TextContent(type="text", text=summary),
        ],
        structured_content=data,
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

    def __init__(self, core: Shortlister, settings: ServiceSettings) -> None:
        self.core = core
        self.settings = settings
        # Arguments are validated here (pydantic), not by the SDK (no get_tool_input_schema), so
        # errors carry the service's error type.
        self.server: Server[Any] = Server(
            "tool-shortlist",
            version="0.1.0",
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._on_call_tool,
        )
        # Host and Origin are checked for every route, /mcp included, by
        # service.middleware.HostGuardMiddleware (SHORTLIST_ALLOWED_HOSTS): not twice here.
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        self._security = security
        self.sessions = self._session_manager()
        self.open_streams = 0  # GET /mcp event streams being served (bound: mcp_max_streams)

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
        send = json_errors(send)  # the SDK's plain-text errors in the service's JSON shape
        if scope.get("method") == "GET":
            await self._stream(scope, receive, send)
            return
        if scope.get("method") == "POST":
            body, connected = await read_body(receive)
            if not connected:
                return
            refused = invalid_request(body)  # an id the SDK would take for a notification
            if refused is not None:
                await Response(refused, 400, media_type="application/json")(scope, receive, send)
                return
            receive = replay(body, receive)
        await self.sessions.handle_request(scope, receive, send)

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A ``GET /mcp`` event stream: at most ``mcp_max_streams`` at once (503 with
        Retry-After past it), closed after ``mcp_stream_idle_seconds`` without an event.
        The HTTP server does not count these connections against ``max_connections``."""
        bound = self.settings.mcp_max_streams
        if self.open_streams >= bound:
            response = error_response(
                503, "too_many_streams",
                f"{self.open_streams} MCP event streams are open, the limit "
                "(SHORTLIST_MCP_MAX_STREAMS); retry later",
                {"limit": bound},
            )  # fmt: skip
            response.headers["Retry-After"] = str(STREAM_RETRY_AFTER_SECONDS)
            await response(scope, receive, send)
            return
        idle = self.settings.mcp_stream_idle_seconds
        last_event = anyio.current_time()
        state = {"started": False, "ended": False, "timed_out": False}

        async def tracked(message: Message) -> None:
            nonlocal last_event
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if body.strip() and not body.lstrip().startswith(b":"):  # comments: keep-alive
                    last_event = anyio.current_time()
                state["ended"] = not message.get("more_body", False)
            await send(message)

        self.open_streams += 1
        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while True:
                        left = last_event + idle - anyio.current_time()
                        if left <= 0:
                            state["timed_out"] = True
                            group.cancel_scope.cancel()
                            return
                        await anyio.sleep(left)

                group.start_soon(watch)
                await self.sessions.handle_request(scope, receive, tracked)
                group.cancel_scope.cancel()
            if state["timed_out"] and state["started"] and not state["ended"]:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.open_streams -= 1

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await self._call_tool(params.name, params.arguments or {}, _caller_headers(ctx))

    async def _call_tool(
        self, name: str, arguments: dict[str, Any], headers: Any = None
    ) -> types.CallToolResult:
        """One tool call; ``headers``: the HTTP request's (for the caller's token hash)."""
        caller = self._caller(headers)
        try:
            if name == "find_tools":
                scope = token_scope(headers.get("authorization"), self.settings) if headers is not None else None
                return await self._find_tools(FindToolsArgs.model_validate(arguments), caller, scope)
            if name == "report_tool_use":
                return await self._report(FeedbackRequest.model_validate(arguments), caller)
            return _error("not_found", f"unknown tool {name!r}", {"tool": name})
        except ValidationError as exc:
            return _invalid(exc)
        except ShortlistError as exc:
            return _error(exc.error_type, exc.message, exc.details)
        except Exception:
            log.exception("MCP tool %s failed", name)
            return _error("internal", "internal server error")

    def _caller(self, headers: Any) -> str | None:
        """Hash of the bearer token on the MCP request being handled (as on HTTP), so the
        learning loop counts MCP feedback per caller; None without tokens or a request."""
        if headers is None:
            return None
        return caller_hash(
            headers.get("authorization"), self.settings, headers.get(CALLER_HEADER), self.core.caller_key()
        )

    async def _find_tools(
        self, args: FindToolsArgs, caller: str | None, scope: tuple[str, ...] | None = None
    ) -> types.CallToolResult:
        request = args.to_request(self.settings.default_registry)

        def run() -> Shortlist:
            return self.core.shortlist(request, caller=caller, token_scope=scope)

        result = await to_thread.run_sync(run)
        return _structured(result.to_json(), shortlist_text(result))

    async def _report(self, body: FeedbackRequest, caller: str | None) -> types.CallToolResult:
        request = body.to_request()

        def run() -> FeedbackResponse:
            return FeedbackResponse.of(self.core.feedback(request, caller=caller))

        response = await to_thread.run_sync(run)
        data = response.model_dump(mode="json")
        verdict = "presented" if response.presented.exact else "not presented"
        text = (
            f"recorded for shortlist {response.shortlist_id} ({verdict}"
            f"{'; a resend, not counted again' if response.duplicate else ''})"
        )
        return _structured(data, text)


def _caller_headers(ctx: ServerRequestContext[Any]) -> Headers | None:
    """The HTTP request headers behind a tool call: every HTTP transport of the SDK attaches
    its starlette request (``ServerMessageMetadata.request_context``); None without one."""
    request = ctx.request
    return request.headers if isinstance(request, Request) else None
