"""OpenAI Responses API (and Agents SDK) client-executed tool search, answered by ``/shortlist``.

Declare the search with :func:`tool_search_tool` (``{"type": "tool_search", "execution":
"client"}``; for an Agents SDK ``Agent``, :func:`agents_tool_search_tool`). When a response holds
a ``tool_search_call`` with ``execution: "client"``, :func:`tool_search_outputs` answers it with a
``tool_search_output`` input item (``call_id`` echoed, the shortlisted tools as Responses
function tools) to append to the next request's ``input``.

Tool names go out provider-safe (:mod:`tool_shortlist_client.names`: ``filesystem/read_file`` is
sent as ``filesystem__read_file``) and come back as registry names through :func:`called_tools`
(a response's function calls, ready for ``feedback(used=...)``) or ``names.to_registry``.

The Agents SDK runner does not execute client tool search itself (it raises and asks the caller
to return a matching ``tool_search_output``), so with the SDK this is a manual Responses loop.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from openai.types.responses import (
    FunctionToolParam,
    ResponseToolSearchCall,
    ResponseToolSearchOutputItemParamParam,
    ToolSearchToolParam,
)

from tool_shortlist_client.adapters._shapes import (
    QUERY_SCHEMA,
    SEARCH_DESCRIPTION,
    query_of,
    tool_spec,
)
from tool_shortlist_client.client import AsyncShortlistClient, ShortlistClient
from tool_shortlist_client.models import Shortlist
from tool_shortlist_client.names import PROVIDER_NAMES, ProviderNames

if TYPE_CHECKING:
    from agents import FunctionTool, ToolSearchTool

ToolSearchCallLike = ResponseToolSearchCall | Mapping[str, Any]


def tool_search_tool(
    description: str = SEARCH_DESCRIPTION, parameters: Mapping[str, Any] | None = None
) -> ToolSearchToolParam:
    """The ``tools`` entry that lets the model ask us for tools (client-executed tool search)."""
    return {
        "type": "tool_search",
        "execution": "client",
        "description": description,
        "parameters": dict(parameters or QUERY_SCHEMA),
    }


def agents_tool_search_tool(
    description: str = SEARCH_DESCRIPTION, parameters: Mapping[str, Any] | None = None
) -> ToolSearchTool:
    """The Agents SDK's ``ToolSearchTool(execution="client", ...)`` with our query schema."""
    from agents import ToolSearchTool

    return ToolSearchTool(
        description=description, execution="client", parameters=dict(parameters or QUERY_SCHEMA)
    )


ToolRunner = Callable[[str, dict[str, Any]], Any]
"""Runs a registry tool: ``(registry tool name, arguments) -> result`` (sync or async)."""


def agents_deferred_tools(
    definitions: Iterable[Mapping[str, Any]],
    run: ToolRunner,
    *,
    names: ProviderNames = PROVIDER_NAMES,
    namespace: str | None = None,
    namespace_description: str | None = None,
) -> list[FunctionTool]:
    """The registry's tools as Agents SDK function tools with ``defer_loading=True``: the
    searchable surface :func:`agents_tool_search_tool` needs (without one the SDK refuses the
    Agent: "ToolSearchTool() requires at least one searchable Responses surface").

    Names are provider-safe; ``run`` gets the registry name back. With ``namespace`` (and its
    ``namespace_description``) the tools are grouped with the SDK's ``tool_namespace``.
    """
    return agents_tools(
        definitions, run, names=names, namespace=namespace,
        namespace_description=namespace_description, defer_loading=True,
    )  # fmt: skip


def agents_tools(
    definitions: Iterable[Mapping[str, Any]],
    run: ToolRunner,
    *,
    names: ProviderNames = PROVIDER_NAMES,
    namespace: str | None = None,
    namespace_description: str | None = None,
    defer_loading: bool = False,
) -> list[FunctionTool]:
    """Tool definitions (a shortlist's ``definitions``, say) as Agents SDK function tools the
    model sees at once: give an ``Agent`` the shortlist for the request (examples/openai_agents.py).

    Names are provider-safe; ``run`` gets the registry name back.
    """
    from agents import FunctionTool, tool_namespace
    from agents.tool_context import ToolContext

    tools: list[FunctionTool] = []
    for definition in definitions:
        spec = tool_spec(definition)

        async def invoke(_: ToolContext[Any], arguments: str, name: str = spec.name) -> Any:
            result = run(name, json.loads(arguments) if arguments else {})
            return await result if inspect.isawaitable(result) else result

        tools.append(
            FunctionTool(
                name=names.to_provider(spec.name),
                description=spec.description,
                params_json_schema=spec.parameters,
                on_invoke_tool=invoke,
                strict_json_schema=False,
                defer_loading=defer_loading,
            )
        )
    if namespace is not None:
        return tool_namespace(name=namespace, description=namespace_description, tools=tools)
    return tools


def function_tool(
    definition: Mapping[str, Any], *, strict: bool = False, names: ProviderNames = PROVIDER_NAMES
) -> FunctionToolParam:
    """A Responses function tool (provider-safe name) from a definition of any accepted shape."""
    spec = tool_spec(definition)
    return {
        "type": "function",
        "name": names.to_provider(spec.name),
        "description": spec.description,
        "parameters": spec.parameters,
        "strict": strict,
    }


def output_item(
    shortlist: Shortlist,
    call_id: str | None,
    *,
    strict: bool = False,
    names: ProviderNames = PROVIDER_NAMES,
) -> ResponseToolSearchOutputItemParamParam:
    """The ``tool_search_output`` input item loading a shortlist's tools."""
    return {
        "type": "tool_search_output",
        "call_id": call_id,
        "execution": "client",
        "status": "completed",
        "tools": [function_tool(d, strict=strict, names=names) for d in shortlist.definitions],
    }


def called_tools(output: Iterable[Any], names: ProviderNames = PROVIDER_NAMES) -> list[str]:
    """Registry names of the ``function_call`` items in a response's ``output``, in order (what
    the agent used, for ``feedback``)."""
    return [
        names.to_registry(str(_field(item, "name")))
        for item in output
        if _field(item, "type") == "function_call"
    ]


def _field(call: ToolSearchCallLike, name: str) -> Any:
    return call.get(name) if isinstance(call, Mapping) else getattr(call, name, None)


def client_search_calls(output: Iterable[Any]) -> list[ToolSearchCallLike]:
    """The client-executed ``tool_search_call`` items of a response's ``output``."""
    return [
        cast(ToolSearchCallLike, item)
        for item in output
        if _field(item, "type") == "tool_search_call" and _field(item, "execution") == "client"
    ]


def tool_search_output(
    client: ShortlistClient,
    call: ToolSearchCallLike,
    *,
    registry: str | None = None,
    strict: bool = False,
    names: ProviderNames = PROVIDER_NAMES,
    **options: Any,
) -> ResponseToolSearchOutputItemParamParam:
    """Answer one ``tool_search_call`` with the shortlist for its query."""
    shortlist = client.shortlist(query_of(_field(call, "arguments")), registry=registry, **options)
    return output_item(shortlist, _field(call, "call_id"), strict=strict, names=names)


async def atool_search_output(
    client: AsyncShortlistClient,
    call: ToolSearchCallLike,
    *,
    registry: str | None = None,
    strict: bool = False,
    names: ProviderNames = PROVIDER_NAMES,
    **options: Any,
) -> ResponseToolSearchOutputItemParamParam:
    query = query_of(_field(call, "arguments"))
    shortlist = await client.shortlist(query, registry=registry, **options)
    return output_item(shortlist, _field(call, "call_id"), strict=strict, names=names)


def tool_search_outputs(
    client: ShortlistClient, output: Iterable[Any], **options: Any
) -> list[ResponseToolSearchOutputItemParamParam]:
    """One ``tool_search_output`` for each client ``tool_search_call`` in ``response.output``."""
    return [tool_search_output(client, call, **options) for call in client_search_calls(output)]


async def atool_search_outputs(
    client: AsyncShortlistClient, output: Iterable[Any], **options: Any
) -> list[ResponseToolSearchOutputItemParamParam]:
    return [
        await atool_search_output(client, call, **options) for call in client_search_calls(output)
    ]
