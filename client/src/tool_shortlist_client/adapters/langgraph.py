"""LangGraph bigtool: tool retrieval backed by ``POST /shortlist``.

``langgraph_bigtool.create_agent(llm, tool_registry, retrieve_tools_function=...,
retrieve_tools_coroutine=...)`` calls the function with the model's search query and expects
tool ids (keys of ``tool_registry``) back. Here the ids are the tool names of the service's
registry, or whatever ``tool_ids`` maps them to; names the agent does not know are dropped (the
graph would fail on them). A registry name is also found under its provider-safe form
(:func:`tool_shortlist_client.names.provider_name`): LangChain tools bound to OpenAI or Anthropic
models must be named ``stripe__list_charges`` for the registry's ``stripe/list_charges``. A ``tool_registry`` keyed by uuid (as bigtool's README builds it) is
mapped by each tool's ``name``; when no shortlisted name maps to any id, the retriever raises
instead of silently returning no tools.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from tool_shortlist_client.client import AsyncShortlistClient, ShortlistClient
from tool_shortlist_client.models import Shortlist
from tool_shortlist_client.names import provider_name

RETRIEVE_DOC = "Retrieve the tools needed for a task, given a plain-words description of it."


class ShortlistRetriever:
    """bigtool retrieval functions that also keep every shortlist they served (for feedback).

    Args:
        client: Sync client (for ``retrieve_tools``).
        async_client: Async client (for ``aretrieve_tools``); give one or both.
        registry: Registry to search (default: the client's).
        tool_ids: bigtool's ``tool_registry`` itself (its keys are the tool names), a tool name
            -> bigtool id map, or a collection of known ids (= names); a name is looked up as
            it is, then in its provider-safe form (``stripe/list_charges`` ->
            ``stripe__list_charges``); names not in it are dropped. ``None``: ids are the names, unfiltered.
        options: Passed to :meth:`ShortlistClient.shortlist` (``k``, ``max_k``, ``depth_bias``...).

    Attributes:
        retrieve_tools: ``(query: str) -> list[str]``, for ``retrieve_tools_function``.
        aretrieve_tools: the coroutine twin, for ``retrieve_tools_coroutine``.
        shortlists: every shortlist served, oldest first.
    """

    def __init__(
        self,
        client: ShortlistClient | None = None,
        async_client: AsyncShortlistClient | None = None,
        *,
        registry: str | None = None,
        tool_ids: Mapping[str, Any] | Collection[str] | None = None,
        **options: Any,
    ) -> None:
        if client is None and async_client is None:
            raise ValueError("give a client, an async_client, or both")
        self.shortlists: list[Shortlist] = []
        self._ids = _name_to_id(tool_ids)

        def retrieve_tools(query: str) -> list[str]:
            if client is None:
                raise RuntimeError("no sync client: use the coroutine")
            return self._served(client.shortlist(query, registry=registry, **options))

        async def aretrieve_tools(query: str) -> list[str]:
            if async_client is None:
                raise RuntimeError("no async client: use the sync function")
            return self._served(await async_client.shortlist(query, registry=registry, **options))

        retrieve_tools.__doc__ = aretrieve_tools.__doc__ = RETRIEVE_DOC
        aretrieve_tools.__name__ = "retrieve_tools"  # the tool's name when only this is given
        self.retrieve_tools: Callable[[str], list[str]] = retrieve_tools
        self.aretrieve_tools: Callable[[str], Awaitable[list[str]]] = aretrieve_tools

    @property
    def last(self) -> Shortlist | None:
        """The most recent shortlist, to report feedback on."""
        return self.shortlists[-1] if self.shortlists else None

    def _served(self, shortlist: Shortlist) -> list[str]:
        self.shortlists.append(shortlist)
        ids = self._ids
        if ids is None:
            return shortlist.names
        chosen = [ids[key] for key in map(_known_key(ids), shortlist.names) if key is not None]
        if shortlist.names and not chosen:
            raise ValueError(
                f"none of the shortlisted tools {shortlist.names[:5]} is in tool_ids: its keys "
                "(or, for a uuid-keyed tool_registry, its tools' .name) must be the registry's "
                f"tool names (registry {shortlist.registry!r})"
            )
        return chosen


def _known_key(ids: Mapping[str, str]) -> Callable[[str], str | None]:
    """Registry name -> its key in ``ids``: the name itself, else its provider-safe form."""

    def key(name: str) -> str | None:
        if name in ids:
            return name
        safe = provider_name(name)
        return safe if safe in ids else None

    return key


def _tool_name(tool: Any) -> str | None:
    name = tool.get("name") if isinstance(tool, Mapping) else getattr(tool, "name", None)
    return name if isinstance(name, str) else None


def _name_to_id(ids: Mapping[str, Any] | Collection[str] | None) -> dict[str, str] | None:
    """Tool name -> bigtool id, from a name -> id map, a tool_registry keyed by name or by
    uuid (its tools' ``name`` then says which), or a collection of ids that are names."""
    if ids is None:
        return None
    if not isinstance(ids, Mapping):
        return {name: name for name in ids}
    mapped: dict[str, str] = {}
    for key, value in ids.items():
        if isinstance(value, str):  # name -> id
            mapped[key] = value
        else:  # tool_registry: id -> tool
            mapped[_tool_name(value) or key] = key
    return mapped


def retrieve_tools_function(
    client: ShortlistClient,
    *,
    registry: str | None = None,
    tool_ids: Mapping[str, Any] | Collection[str] | None = None,
    **options: Any,
) -> Callable[[str], list[str]]:
    """A bigtool ``retrieve_tools_function`` backed by ``/shortlist``."""
    return ShortlistRetriever(
        client, registry=registry, tool_ids=tool_ids, **options
    ).retrieve_tools


def retrieve_tools_coroutine(
    client: AsyncShortlistClient,
    *,
    registry: str | None = None,
    tool_ids: Mapping[str, Any] | Collection[str] | None = None,
    **options: Any,
) -> Callable[[str], Awaitable[list[str]]]:
    """A bigtool ``retrieve_tools_coroutine`` backed by ``/shortlist``."""
    retriever = ShortlistRetriever(
        async_client=client, registry=registry, tool_ids=tool_ids, **options
    )
    return retriever.aretrieve_tools
