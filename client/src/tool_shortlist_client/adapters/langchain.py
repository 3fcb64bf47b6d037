"""LangChain v1 agent middleware: each model call sees the shortlist, not every tool.

``create_agent(model, tools=all_tools, middleware=[ShortlistMiddleware(client)])``: before each
model call the middleware asks ``POST /shortlist`` for the latest user turn (once per turn; the
calls after tool results reuse it) and replaces the request's tools with the shortlisted ones,
in shortlist order, plus the ``always_include`` pins and any provider tool dicts. It is the
service-backed twin of LangChain's ``LLMToolSelectorMiddleware``: the same hook
(``wrap_model_call``), the same pins, no extra model call. After the model has called tools,
the next model call asks again with ``called`` (the turn's calls so far, oldest first) and adds
the tools that are new to the bound ones, at most ``reasks`` times a turn: the next step of a
chain (``search_films`` -> ``get_film_cast``) is offered once its lookup ran. When the agent run ends
(``after_agent``) the tools the model actually called from the shortlist are reported with
``POST /feedback``, each call marked useful unless its tool answered with an error.

A shortlisted registry name matches an agent tool named the same or its provider-safe name
(``fs/read_file`` -> ``fs__read_file``, :mod:`tool_shortlist_client.names`). The request names
the agent's tools as ``allowed_tools`` (``scope_to_agent_tools``, on by default; the pins
left out, they are offered anyway), so the service ranks and caps only tools the agent can
call and no slot goes to a tool it would have to drop. Agent tools the registry does not hold
are refused by name once (422); they are left out of that request and of later ones. A
shortlist none of whose tools the agent has is an error rather than a silent empty tool list.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain.agents.middleware.types import ModelCallResult
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage

from tool_shortlist_client.client import AsyncShortlistClient, ShortlistClient
from tool_shortlist_client.errors import InvalidRequestError, ShortlistClientError
from tool_shortlist_client.models import FeedbackResult, Shortlist
from tool_shortlist_client.names import decode_readable, provider_name

logger = logging.getLogger(__name__)

_GLOB = frozenset("*?[")  # the service reads these in allowed_tools as a pattern
_SCOPE_ATTEMPTS = 20  # requests that drop names the registry lacks (at most 50 named per 422)
REMEMBERED_TURNS = 256
"""User turns whose shortlist is kept for the calls and the feedback that follow."""

REASKS = 4
"""Default re-asks per user turn after tool calls (each one a ``POST /shortlist``)."""


@dataclass
class _Turn:
    """One user turn's shortlist and which agent tool each shortlisted name became."""

    shortlist: Shortlist
    registry_name: dict[str, str]  # agent tool name -> registry tool name
    reported: bool = False
    tool_names: list[str] = field(default_factory=list)
    asked_with: tuple[str, ...] = ()  # the calls the latest ask for this turn knew of
    reasks: int = 0


class ShortlistMiddleware(AgentMiddleware[AgentState[Any], Any]):
    """Replaces the model's tool list with the service's shortlist for the latest user turn.

    Args:
        client: Sync client (``agent.invoke``); give one or both.
        async_client: Async client (``agent.ainvoke``); without it the async path runs the sync
            client in a thread.
        registry: Registry to search (default: the client's).
        always_include: Agent tool names always offered, outside the shortlist (like
            ``LLMToolSelectorMiddleware``'s); each must be one of the agent's tools.
        feedback: Report the called shortlisted tools when the run ends (default on).
        scope_to_agent_tools: Send the agent's tools (registry or readable provider-safe names)
            as ``allowed_tools`` (default on); off, the service ranks the whole registry.
        reasks: Asks per user turn after tool calls, with the calls so far (default
            :data:`REASKS`; 0: the first shortlist is kept for the whole turn).
        options: Passed to :meth:`ShortlistClient.shortlist`: ``k``, ``max_k``, ``depth_bias``,
            ``policy``, ``scorer``, ``allow_empty``.

    Attributes:
        shortlists: every user turn's shortlist, oldest first.
        reasked: every shortlist a re-ask after tool calls served, oldest first.
        reask_errors: every re-ask the service or the network refused (the run went on).
        feedback_results: every feedback acknowledgement, oldest first.
        feedback_errors: every report the service or the network refused (also logged).
    """

    def __init__(
        self,
        client: ShortlistClient | None = None,
        async_client: AsyncShortlistClient | None = None,
        *,
        registry: str | None = None,
        always_include: Sequence[str] = (),
        feedback: bool = True,
        scope_to_agent_tools: bool = True,
        reasks: int = REASKS,
        **options: Any,
    ) -> None:
        super().__init__()
        if client is None and async_client is None:
            raise ValueError("give a client, an async_client, or both")
        self.client = client
        self.async_client = async_client
        self.registry = registry
        self.always_include = list(always_include)
        self.report_feedback = feedback
        self.scope_to_agent_tools = scope_to_agent_tools
        self._not_in_registry: set[str] = set()  # allowed_tools names the service refused
        self.reasks = max(0, reasks)
        self.options = options
        self.shortlists: list[Shortlist] = []
        self.feedback_results: list[FeedbackResult] = []
        self.feedback_errors: list[ShortlistClientError] = []
        self.reasked: list[Shortlist] = []
        self.reask_errors: list[ShortlistClientError] = []
        self._turns: OrderedDict[str, _Turn] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def last(self) -> Shortlist | None:
        """The most recent shortlist."""
        return self.shortlists[-1] if self.shortlists else None

    # -- the model call ----------------------------------------------------------------------------

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelCallResult:
        """Shortlist the latest user turn (once) and call the model with those tools."""
        turn = _latest_user_turn(request.messages)
        if turn is None or not request.tools:
            return handler(request)
        key, query = turn
        known = self._known(key)
        if known is None:
            client = self._sync_client()
            allowed = self._allowed(request)
            for _ in range(_SCOPE_ATTEMPTS):
                try:
                    shortlist = client.shortlist(query, **self._ask(allowed))
                    break
                except InvalidRequestError as error:
                    allowed = self._without_refused(allowed, error)
            else:
                shortlist = client.shortlist(query, **self._ask(allowed))
            known = self._remember(key, request, shortlist)
        elif (called := self._reask(request.messages, known)) is not None:
            try:
                shortlist = self._sync_client().shortlist(
                    query, called=called, **self._ask(self._allowed(request))
                )
            except ShortlistClientError as error:
                self._reask_failed(error)
            else:
                self._extend(known, request, shortlist)
        return handler(self._narrowed(request, known))

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> ModelCallResult:
        """The async twin of :meth:`wrap_model_call`."""
        turn = _latest_user_turn(request.messages)
        if turn is None or not request.tools:
            return await handler(request)
        key, query = turn
        known = self._known(key)
        if known is None:
            allowed = self._allowed(request)
            for _ in range(_SCOPE_ATTEMPTS):
                try:
                    shortlist = await self._ashortlist(query, allowed)
                    break
                except InvalidRequestError as error:
                    allowed = self._without_refused(allowed, error)
            else:
                shortlist = await self._ashortlist(query, allowed)
            known = self._remember(key, request, shortlist)
        elif (called := self._reask(request.messages, known)) is not None:
            try:
                if self.async_client is not None:
                    shortlist = await self.async_client.shortlist(
                        query, called=called, **self._ask(self._allowed(request))
                    )
                else:
                    shortlist = await asyncio.to_thread(
                        self._sync_client().shortlist, query, called=called,
                        **self._ask(self._allowed(request)),
                    )
            except ShortlistClientError as error:
                self._reask_failed(error)
            else:
                self._extend(known, request, shortlist)
        return await handler(self._narrowed(request, known))

    # -- feedback at the end of the run -----------------------------------------------------------

    def after_agent(self, state: AgentState[Any], runtime: Any) -> dict[str, Any] | None:
        """Report the shortlisted tools the model called in the latest user turn. A failed
        report is logged and kept in ``feedback_errors``; it never fails the agent's run."""
        report = self._pending_report(state["messages"])
        if report is not None:
            turn, used, calls = report
            try:
                result = self._sync_client().feedback(turn.shortlist, used, calls=calls)
            except ShortlistClientError as error:
                self._failed(turn, error)
            else:
                self.feedback_results.append(result)
        return None

    async def aafter_agent(self, state: AgentState[Any], runtime: Any) -> dict[str, Any] | None:
        """The async twin of :meth:`after_agent`."""
        report = self._pending_report(state["messages"])
        if report is not None:
            turn, used, calls = report
            try:
                if self.async_client is not None:
                    result = await self.async_client.feedback(turn.shortlist, used, calls=calls)
                else:
                    client = self._sync_client()
                    result = await asyncio.to_thread(
                        client.feedback, turn.shortlist, used, calls=calls
                    )
            except ShortlistClientError as error:
                self._failed(turn, error)
            else:
                self.feedback_results.append(result)
        return None

    def _failed(self, turn: _Turn, error: ShortlistClientError) -> None:
        logger.warning(
            "feedback on shortlist %s not recorded: %s", turn.shortlist.shortlist_id, error
        )
        self.feedback_errors.append(error)

    # -- helpers -----------------------------------------------------------------------------------

    def _sync_client(self) -> ShortlistClient:
        if self.client is None:
            raise RuntimeError("no sync client: give client=, or run the agent with ainvoke")
        return self.client

    async def _ashortlist(self, query: str, allowed: list[str] | None) -> Shortlist:
        if self.async_client is not None:
            return await self.async_client.shortlist(query, **self._ask(allowed))
        return await asyncio.to_thread(self._sync_client().shortlist, query, **self._ask(allowed))

    def _ask(self, allowed: list[str] | None = None) -> dict[str, Any]:
        scope = {"allowed_tools": allowed} if allowed else {}
        return {"registry": self.registry, **self.options, **scope}

    def _allowed(self, request: ModelRequest) -> list[str] | None:
        """The agent's tools as registry names (pins left out), or None when not scoping.

        A provider-safe name (``fs__read_file``) is sent with the registry name it decodes to
        (``fs/read_file``): the registry holds one of them, and the other is refused once.
        Glob characters in a name are escaped so it matches only itself.
        """
        if not self.scope_to_agent_tools:
            return None
        names: dict[str, None] = {}
        for tool in request.tools:
            if isinstance(tool, dict) or tool.name in self.always_include:
                continue
            decoded = decode_readable(tool.name) if "__" in tool.name else None
            for name in (tool.name, decoded):
                sent = glob.escape(name) if name and _GLOB.intersection(name) else name
                if sent and sent not in self._not_in_registry:
                    names[sent] = None
        return list(names) or None

    def _without_refused(self, allowed: list[str] | None, error: InvalidRequestError) -> list[str] | None:
        """``allowed`` less the names the service said match no tool (remembered, so later
        requests leave them out); re-raises an error about anything else. A 422 lists at most
        50 problems (and counts the rest), each cut to 200 characters: the next attempt drops
        the next ones, and a cut name drops the names it begins."""
        details = error.details if isinstance(error.details, list) else []
        listed = [d for d in details if isinstance(d, dict) and "omitted" not in d]
        cut = {
            str(d["pattern"]) for d in listed if d.get("field") == "allowed_tools" and "pattern" in d
        }
        if not allowed or not cut or len(cut) != len(listed):
            raise error
        refused = {n for n in allowed if n in cut or any(len(c) >= 200 and n.startswith(c) for c in cut)}
        with self._lock:
            self._not_in_registry.update(refused)
        kept = [name for name in allowed if name not in refused]
        return kept or None

    def _known(self, key: str) -> _Turn | None:
        with self._lock:
            return self._turns.get(key)

    def _remember(self, key: str, request: ModelRequest, shortlist: Shortlist) -> _Turn:
        """Map the shortlist onto the agent's tools and keep it for the turn's later calls."""
        agent_names = {tool.name for tool in request.tools if not isinstance(tool, dict)}
        missing = [name for name in self.always_include if name not in agent_names]
        if missing:
            raise ValueError(
                f"always_include names tools the agent does not have: {missing}; "
                f"its tools: {sorted(agent_names)}"
            )
        registry_name: dict[str, str] = {}
        for name in shortlist.names:
            match = next((a for a in (name, provider_name(name)) if a in agent_names), None)
            if match is not None and match not in registry_name:
                registry_name[match] = name
        if shortlist.names and not registry_name:
            raise ValueError(
                f"none of the shortlisted tools {shortlist.names[:5]} is one of the agent's tools "
                f"{sorted(agent_names)[:10]}: give create_agent the registry's tools, named as "
                f"in the registry or by their provider-safe names (registry {shortlist.registry!r})"
            )
        turn = _Turn(shortlist, registry_name, tool_names=list(registry_name))
        with self._lock:
            self.shortlists.append(shortlist)
            self._turns[key] = turn
            while len(self._turns) > REMEMBERED_TURNS:
                self._turns.popitem(last=False)
        return turn

    def _reask(self, messages: Sequence[AnyMessage], turn: _Turn) -> list[str] | None:
        """The turn's called registry tools (oldest first) when they are new since the last ask
        and re-asks are left; None: keep the tools bound now."""
        start = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        names = [
            turn.registry_name[call["name"]]
            for call in _tool_calls(messages[start:])
            if call["name"] in turn.registry_name
        ]
        called = tuple(dict.fromkeys(names))
        with self._lock:
            if not called or called == turn.asked_with or turn.reasks >= self.reasks:
                return None
            turn.asked_with = called
            turn.reasks += 1
        return list(called)

    def _reask_failed(self, error: ShortlistClientError) -> None:
        """A re-ask the service or the network refused: the bound tools stay, the run goes on."""
        logger.warning("re-ask after tool calls failed; keeping the bound tools: %s", error)
        self.reask_errors.append(error)

    def _extend(self, turn: _Turn, request: ModelRequest, shortlist: Shortlist) -> None:
        """Add the tools of a re-ask the turn does not offer yet (the bound ones stay)."""
        agent_names = {tool.name for tool in request.tools if not isinstance(tool, dict)}
        with self._lock:
            self.reasked.append(shortlist)
            for name in shortlist.names:
                match = next((a for a in (name, provider_name(name)) if a in agent_names), None)
                if match is not None and match not in turn.registry_name:
                    turn.registry_name[match] = name
                    turn.tool_names.append(match)

    def _narrowed(self, request: ModelRequest, turn: _Turn) -> ModelRequest:
        """The request with the turn's tools (shortlist order), the pins, then provider dicts."""
        by_name = {tool.name: tool for tool in request.tools if not isinstance(tool, dict)}
        chosen = [name for name in turn.tool_names if name not in self.always_include]
        tools: list[Any] = [by_name[name] for name in [*chosen, *self.always_include]]
        tools.extend(tool for tool in request.tools if isinstance(tool, dict))
        return request.override(tools=tools)

    def _pending_report(
        self, messages: Sequence[AnyMessage]
    ) -> tuple[_Turn, list[str], list[tuple[str, bool]]] | None:
        """The latest turn's shortlist with the registry tools called and each call's outcome,
        once per turn; None when feedback is off or no shortlisted tool was called."""
        if not self.report_feedback:
            return None
        found = _latest_user_turn(messages)
        if found is None:
            return None
        turn = self._known(found[0])
        if turn is None:
            return None
        start = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        outcome = {
            m.tool_call_id: m.status != "error"
            for m in messages[start:]
            if isinstance(m, ToolMessage)
        }
        calls = [
            (turn.registry_name[call["name"]], outcome.get(str(call.get("id")), True))
            for call in _tool_calls(messages[start:])
            if call["name"] in turn.registry_name
        ]
        used = list(dict.fromkeys(name for name, _ in calls))
        with self._lock:
            if turn.reported or not used:
                return None
            turn.reported = True
        return turn, used, calls


def _tool_calls(messages: Iterable[AnyMessage]) -> list[Any]:
    return [call for m in messages if isinstance(m, AIMessage) for call in m.tool_calls]


def _latest_user_turn(messages: Sequence[AnyMessage]) -> tuple[str, str] | None:
    """(a key naming the latest user message, its text), or None without one or when it holds
    no text to search with (only an image, say: that turn's model calls keep every tool)."""
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            text = str(message.text)
            return ((message.id or f"text:{text}"), text) if text.strip() else None
    return None
