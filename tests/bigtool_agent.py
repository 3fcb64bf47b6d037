"""LangGraph bigtool agents against a real server, run by tests/test_bigtool.py in a virtualenv of
their own: the client's ``bigtool`` extra holds langgraph at 1.0.1, apart from the newest LangChain
the other adapters are tested on. Fake chat models play the turns; the shortlists come from the
service. Prints one JSON object: what each scenario saw.

    python tests/bigtool_agent.py SERVER_URL DOC_BLOCK_FILE
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langgraph_bigtool import create_agent  # type: ignore[import-untyped,import-not-found,unused-ignore]

from tool_shortlist_client import AsyncShortlistClient, ShortlistClient
from tool_shortlist_client.adapters.langgraph import ShortlistRetriever, retrieve_tools_coroutine

WEATHER_QUERY = "what's the weather in Paris tomorrow?"
CHARGES_QUERY = "list the recent card charges"


def make_tools(names: list[str], calls: list[str]) -> dict[str, StructuredTool]:
    """LangChain tools by name that record their calls."""

    def make(name: str) -> StructuredTool:
        def run(**kwargs: Any) -> str:
            calls.append(name)
            return f"{name} ran with {json.dumps(kwargs, sort_keys=True)}"

        schema = {"type": "object", "properties": {"city": {"type": "string"}}}
        return StructuredTool.from_function(run, name=name, description=f"The {name} tool.", args_schema=schema)

    return {name: make(name) for name in names}


def fake_model(bound: list[list[str]], query: str, tool: str, answer: str) -> GenericFakeChatModel:
    """Calls retrieve_tools with ``query``, then ``tool``, then answers; records bound tools."""

    class ToolBindingFake(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **_: Any) -> Any:
            bound.append([getattr(t, "name", None) or t.__name__ for t in tools])
            return self

    script = [
        AIMessage("", tool_calls=[{"name": "retrieve_tools", "args": {"query": query}, "id": "c1"}]),
        AIMessage("", tool_calls=[{"name": tool, "args": {"city": "Paris"}, "id": "c2"}]),
        AIMessage(answer),
    ]
    return ToolBindingFake(messages=iter(script))


def sync_graph(url: str) -> dict[str, Any]:
    calls: list[str] = []
    tools = make_tools(["get_weather", "send_email", "convert_currency", "fs/read_file"], calls)
    bound: list[list[str]] = []
    with ShortlistClient(url, registry="weather") as client:
        retriever = ShortlistRetriever(client, registry="weather", tool_ids=tools)
        llm = fake_model(bound, WEATHER_QUERY, "get_weather", "Sunny in Paris.")
        graph = create_agent(llm, tools, retrieve_tools_function=retriever.retrieve_tools).compile()
        state = graph.invoke({"messages": [("user", WEATHER_QUERY)]})
        shortlist = retriever.last
        assert shortlist is not None
        feedback = client.feedback(shortlist, ["get_weather"], success=True)
    retrieved = next(m for m in state["messages"] if isinstance(m, ToolMessage))
    return {
        "names": shortlist.names, "selected": state["selected_tool_ids"], "bound": bound,
        "calls": calls, "retrieved": str(retrieved.content), "answer": state["messages"][-1].content,
        "feedback_exact": feedback.presented.exact,
    }  # fmt: skip


def uuid_registry(url: str) -> dict[str, Any]:
    tools = make_tools(["get_weather", "send_email", "convert_currency"], [])
    by_uuid = {str(uuid.uuid4()): tool for tool in tools.values()}
    with ShortlistClient(url, registry="weather") as client:
        retriever = ShortlistRetriever(client, tool_ids=by_uuid)
        ids = retriever.retrieve_tools(WEATHER_QUERY)
        try:
            ShortlistRetriever(client, tool_ids={str(uuid.uuid4()): {"name": "else"}}).retrieve_tools(WEATHER_QUERY)
            unrelated = "no error"
        except ValueError as exc:
            unrelated = str(exc)
    assert retriever.last is not None
    return {
        "ids_known": bool(ids) and set(ids) <= set(by_uuid),
        "first_tool": by_uuid[ids[0]].name, "first_name": retriever.last.names[0], "unrelated": unrelated,
    }  # fmt: skip


def async_graph(url: str) -> dict[str, Any]:
    calls: list[str] = []
    tools = make_tools(["get_weather", "send_email", "convert_currency"], calls)

    async def run() -> dict[str, Any]:
        async with AsyncShortlistClient(url) as aclient:
            retrieve = retrieve_tools_coroutine(aclient, registry="weather", tool_ids=set(tools))
            llm = fake_model([], WEATHER_QUERY, "get_weather", "Sunny.")
            graph = create_agent(llm, tools, retrieve_tools_coroutine=retrieve).compile()
            result: dict[str, Any] = await graph.ainvoke({"messages": [("user", WEATHER_QUERY)]})
            return result

    state = asyncio.run(run())
    return {"selected": state["selected_tool_ids"], "calls": calls}


def provider_names(url: str) -> dict[str, Any]:
    """LangChain tools carry provider-safe names (``stripe__list_charges``); the registry has
    ``stripe/list_charges``."""
    calls: list[str] = []
    tools = make_tools(["refund_payment", "create_invoice", "stripe__list_charges", "get_balance"], calls)
    bound: list[list[str]] = []
    with ShortlistClient(url, registry="payments") as client:
        retriever = ShortlistRetriever(client, tool_ids=tools)
        llm = fake_model(bound, CHARGES_QUERY, "stripe__list_charges", "Three charges.")
        graph = create_agent(llm, tools, retrieve_tools_function=retriever.retrieve_tools).compile()
        state = graph.invoke({"messages": [("user", CHARGES_QUERY)]})
    assert retriever.last is not None
    return {"names": retriever.last.names, "selected": state["selected_tool_ids"], "bound": bound, "calls": calls}


def doc_block(url: str, code: str) -> dict[str, Any]:
    """docs/client.md's bigtool block as written, with the names it assumes bound."""
    calls: list[str] = []
    tool_registry = make_tools(["refund_payment", "create_invoice", "stripe__list_charges", "get_balance"], calls)
    bound: list[list[str]] = []
    llm = fake_model(bound, "refund order 1234", "refund_payment", "Refunded.")

    async def run() -> dict[str, Any]:
        async with AsyncShortlistClient(url) as async_client:
            with ShortlistClient(url) as client:
                namespace = {"client": client, "async_client": async_client, "llm": llm,
                             "tool_registry": tool_registry}  # fmt: skip
                await asyncio.to_thread(exec, compile(code, "docs/client.md:bigtool", "exec"), namespace)
                return namespace

    namespace = asyncio.run(run())
    return {"names": namespace["retriever"].last.names, "bound": bound, "calls": calls}


def main() -> None:
    url, block = sys.argv[1], Path(sys.argv[2]).read_text(encoding="utf-8")
    results = {
        "sync": sync_graph(url), "uuid": uuid_registry(url), "async": async_graph(url),
        "provider_names": provider_names(url), "doc": doc_block(url, block),
    }  # fmt: skip
    print(json.dumps(results))


if __name__ == "__main__":
    main()
