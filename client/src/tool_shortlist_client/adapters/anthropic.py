"""Claude custom tool search: a search tool of ours whose results are ``tool_reference`` blocks.

Send every tool with ``defer_loading: true`` (:func:`deferred_tools`) plus :func:`search_tool`.
When Claude calls the search tool, answer its ``tool_use`` with :func:`tool_search_result`: a
``tool_result`` whose content is one ``{"type": "tool_reference", "tool_name": ...}`` block per
shortlisted tool; the API then loads those deferred definitions into Claude's context.

Tool names go out provider-safe (:mod:`tool_shortlist_client.names`) in both the deferred
definitions and the references, and :func:`used_tools` turns Claude's ``tool_use`` blocks back
into registry names for ``feedback(used=...)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from anthropic.types import (
    TextBlockParam,
    ToolParam,
    ToolReferenceBlockParam,
    ToolResultBlockParam,
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

SEARCH_TOOL_NAME = "search_tools"
NO_MATCH = "No tool in the catalogue fits this request."
ToolUseLike = Any  # anthropic ToolUseBlock, or its dict form


def search_tool(name: str = SEARCH_TOOL_NAME, description: str = SEARCH_DESCRIPTION) -> ToolParam:
    """The custom search tool definition (not deferred)."""
    return {"name": name, "description": description, "input_schema": dict(QUERY_SCHEMA)}


def deferred_tools(
    definitions: Iterable[Mapping[str, Any]], names: ProviderNames = PROVIDER_NAMES
) -> list[ToolParam]:
    """Anthropic tool definitions with ``defer_loading: true`` and provider-safe names, from any
    accepted shape."""
    tools: list[ToolParam] = []
    for definition in definitions:
        spec = tool_spec(definition)
        tools.append(
            {
                "name": names.to_provider(spec.name),
                "description": spec.description,
                "input_schema": spec.parameters,
                "defer_loading": True,
            }
        )
    return tools


def tool_references(
    shortlist: Shortlist, names: ProviderNames = PROVIDER_NAMES
) -> list[ToolReferenceBlockParam]:
    """One ``tool_reference`` block per shortlisted tool, in shortlist order."""
    return [
        {"type": "tool_reference", "tool_name": names.to_provider(name)}
        for name in shortlist.names
    ]


def result_block(
    shortlist: Shortlist, tool_use_id: str, names: ProviderNames = PROVIDER_NAMES
) -> ToolResultBlockParam:
    """The ``tool_result`` answering a search ``tool_use`` (a text block when nothing fits)."""
    content: list[ToolReferenceBlockParam | TextBlockParam] = [*tool_references(shortlist, names)]
    if not content:
        content = [{"type": "text", "text": NO_MATCH}]
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}


def _use(block: ToolUseLike) -> tuple[str, Any]:
    if isinstance(block, Mapping):
        return str(block["id"]), block.get("input")
    return str(block.id), block.input


def tool_search_result(
    client: ShortlistClient,
    tool_use: ToolUseLike,
    *,
    registry: str | None = None,
    names: ProviderNames = PROVIDER_NAMES,
    **options: Any,
) -> ToolResultBlockParam:
    """Run the search ``tool_use`` through ``/shortlist`` and return its ``tool_result``."""
    use_id, arguments = _use(tool_use)
    shortlist = client.shortlist(query_of(arguments), registry=registry, **options)
    return result_block(shortlist, use_id, names)


async def atool_search_result(
    client: AsyncShortlistClient,
    tool_use: ToolUseLike,
    *,
    registry: str | None = None,
    names: ProviderNames = PROVIDER_NAMES,
    **options: Any,
) -> ToolResultBlockParam:
    use_id, arguments = _use(tool_use)
    shortlist = await client.shortlist(query_of(arguments), registry=registry, **options)
    return result_block(shortlist, use_id, names)


def _field(block: Any, key: str) -> Any:
    return block.get(key) if isinstance(block, Mapping) else getattr(block, key, None)


def search_uses(content: Iterable[Any], name: str = SEARCH_TOOL_NAME) -> list[ToolUseLike]:
    """The ``tool_use`` blocks of a message's content that call the search tool."""
    return [b for b in content if _field(b, "type") == "tool_use" and _field(b, "name") == name]


def used_tools(
    content: Iterable[Any],
    names: ProviderNames = PROVIDER_NAMES,
    search_name: str = SEARCH_TOOL_NAME,
) -> list[str]:
    """Registry names of the registry tools Claude called in a message's content (search calls
    left out), in order: what the agent used, for ``feedback``."""
    return [
        names.to_registry(str(_field(b, "name")))
        for b in content
        if _field(b, "type") == "tool_use" and _field(b, "name") != search_name
    ]
