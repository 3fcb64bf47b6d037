"""Chains of tools through every face, on a real server (real MiniLM, real ONNX policy):
``called`` over HTTP, the Python client, MCP ``find_tools`` (the real SDK client) and the
LangChain middleware (real ``create_agent``, a scripted model that calls a lookup, then the
action the lookup's id is for); ``GET``/``POST /registries/{r}/graph``; bad input is a 422
naming the problem, and changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_graph import REST
from tests.test_mcp import with_session
from tool_shortlist_client import ShortlistClient
from tool_shortlist_client.errors import APIError

pytestmark = pytest.mark.e2e

QUERY = "my email is ann@example.com: return the items of my last order"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path):
    from tests.server import Servers

    servers = Servers(tmp_path_factory.mktemp("chains"), minilm_cache)
    started = servers.start()
    with ShortlistClient(started.url) as admin:
        admin.put_registry("shop", REST)
    yield started
    servers.close()


def shortlist(url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/shortlist", json={"registry": "shop", "query": QUERY, **body}, timeout=60)


def test_called_over_http_and_the_client(server):
    first = shortlist(server.url).json()
    assert "find_customer_by_email" in [t["name"] for t in first["tools"]]
    after = shortlist(server.url, called=["find_customer_by_email"]).json()
    names = [t["name"] for t in after["tools"]]
    assert "find_customer_by_email" not in names
    assert names[0] in ("get_customer", "list_orders")
    assert after["tools"][0]["reason"] == "next step after find_customer_by_email (called)"
    with ShortlistClient(server.url, registry="shop") as client:
        again = client.shortlist(QUERY, called=["find_customer_by_email", "list_orders"])
    assert again.tools[0].name in ("get_order", "return_order_items")
    assert again.tools[0].reason and again.tools[0].reason.startswith("next step after list_orders")


def test_bad_called_is_a_422_naming_it(server):
    unknown = shortlist(server.url, called=["list_orders", "no_such_tool"])
    assert unknown.status_code == 422
    error = unknown.json()["error"]
    assert error["type"] == "validation" and "no_such_tool" in error["message"]
    assert error["details"] == [{"field": "called", "message": "unknown tool 'no_such_tool'"}]
    assert shortlist(server.url, called="list_orders").status_code == 422  # not a list
    assert shortlist(server.url, called=[1]).status_code == 422
    assert shortlist(server.url, called=["x"] * 101).status_code == 422
    with ShortlistClient(server.url, registry="shop") as client, pytest.raises(APIError) as refused:
        client.shortlist(QUERY, called=["nope"])
    assert refused.value.status_code == 422 and "nope" in str(refused.value)


def test_a_scoped_request_fills_a_need_with_an_allowed_provider(server):
    """list_orders needs a customer_id that find_customer_by_email (the real MiniLM's pick) and
    whoami provide: a scope without the first gets whoami appended, never the first."""
    query, need = "return the items of order 17", "prerequisite of list_orders: fills 'customer_id'"
    whole = shortlist(server.url, query=query, max_k=5).json()["tools"]
    assert ("find_customer_by_email", need) in [(t["name"], t["reason"]) for t in whole]
    allowed = ["return_order_items", "list_orders", "whoami", "get_weather"]
    scoped = shortlist(server.url, query=query, max_k=5, allowed_tools=allowed).json()["tools"]
    assert {t["name"] for t in scoped} <= set(allowed)
    assert ("whoami", need) in [(t["name"], t["reason"]) for t in scoped]


def test_graph_read_and_edited_over_http(server):
    graph = httpx.get(f"{server.url}/registries/shop/graph", timeout=30).json()
    version = graph["version"]
    edge = next(e for e in graph["edges"] if (e["provider"], e["consumer"]) == ("search_films", "get_film"))
    assert edge == {"provider": "search_films", "consumer": "get_film", "param": "film_id", "source": "schema",
                    "evidence": "'film_id' names film; its name searchs film"}  # fmt: skip
    bad = httpx.post(f"{server.url}/registries/shop/graph",
                     json={"add": [["get_customer", "ghost"]], "remove": [["phantom", "get_film"]]}, timeout=30)  # fmt: skip
    assert bad.status_code == 422
    assert "ghost" in bad.json()["error"]["message"] and "phantom" in bad.json()["error"]["message"]
    for body in ({"add": [["only"]]}, {"add": "x"}, {"added": []}, {"add": [["get_film", "get_film"]]}):
        assert httpx.post(f"{server.url}/registries/shop/graph", json=body, timeout=30).status_code == 422, body
    assert httpx.get(f"{server.url}/registries/shop/graph", timeout=30).json()["version"] == version
    ok = httpx.post(f"{server.url}/registries/shop/graph",
                    json={"add": [["get_customer", "get_order"]], "remove": [["search_films", "get_film"]]},
                    timeout=30)  # fmt: skip
    assert ok.status_code == 200 and ok.json()["version"] == version + 1
    edited = httpx.get(f"{server.url}/registries/shop/graph", timeout=30).json()
    pairs = {(e["provider"], e["consumer"]): e["source"] for e in edited["edges"]}
    assert pairs[("get_customer", "get_order")] == "admin" and ("search_films", "get_film") not in pairs
    assert edited["edits"] == {"added": [["get_customer", "get_order"]], "removed": [["search_films", "get_film"]]}
    assert httpx.get(f"{server.url}/registries/nowhere/graph", timeout=30).status_code == 404


def test_called_through_mcp_find_tools(server):
    async def use(session) -> list[Any]:
        return [
            await session.call_tool("find_tools", {"query": QUERY, "registry": "shop",
                                                   "called": ["find_customer_by_email"]}),
            await session.call_tool("find_tools", {"query": QUERY, "registry": "shop", "called": ["ghost"]}),
        ]

    found, unknown = with_session(server.url, None, use)
    tools = found.structured_content["tools"]
    assert tools[0]["name"] in ("get_customer", "list_orders")
    assert tools[0]["reason"] == "next step after find_customer_by_email (called)"
    assert "find_customer_by_email" not in [t["name"] for t in tools]
    assert unknown.is_error and unknown.structured_content["error"]["type"] == "validation"
    assert "ghost" in unknown.content[0].text


def test_middleware_asks_again_after_the_lookup_and_binds_the_next_step(server):
    """A scripted model calls the lookup (list_orders), then the action its order id is for
    (get_order, not in the first list): the model call after the lookup is bound with it."""
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import StructuredTool

    from tool_shortlist_client.adapters.langchain import ShortlistMiddleware

    calls: list[str] = []

    def make(name: str) -> StructuredTool:
        def run(**kwargs: Any) -> str:
            calls.append(name)
            return json.dumps({"orders": [{"order_id": "o-7"}]}) if name == "list_orders" else "ok"

        schema = {"type": "object", "properties": {"value": {"type": "string"}}}
        return StructuredTool.from_function(run, name=name, description=name, args_schema=schema)

    def tool_name(tool: dict) -> str:
        return tool["function"]["name"] if "function" in tool else tool["name"]

    agent_tools = [make(tool_name(t)) for t in REST]
    bound: list[list[str]] = []

    class Scripted(GenericFakeChatModel):
        def bind_tools(self, tools, **_: Any):
            bound.append([t.name for t in tools])
            return self

    script = [
        AIMessage("", tool_calls=[{"name": "list_orders", "args": {"value": "ann@example.com"}, "id": "a"}]),
        AIMessage("", tool_calls=[{"name": "get_order", "args": {"value": "o-7"}, "id": "b"}]),
        AIMessage("Done."),
    ]
    with ShortlistClient(server.url, registry="shop") as client:
        middleware = ShortlistMiddleware(client, max_k=2, feedback=False)
        agent = create_agent(Scripted(messages=iter(script)), tools=agent_tools, middleware=[middleware])
        agent.invoke({"messages": [("user", QUERY)]})

    assert calls == ["list_orders", "get_order"]
    assert len(bound) == 3 and len(middleware.shortlists) == 1 and len(middleware.reasked) == 2  # one per call
    assert "list_orders" in bound[0] and "get_order" not in bound[0]
    assert middleware.reasked[0].tools[0].reason == "next step after list_orders (called)"
    new = [n for n in bound[1] if n not in bound[0]]
    assert "get_order" in new
    assert bound[1][: len(bound[0])] == bound[0]  # the bound tools stay, what is new is added
    assert set(bound[2]) >= set(bound[1])

    with ShortlistClient(server.url, registry="shop") as client:
        limited = ShortlistMiddleware(client, max_k=2, feedback=False, reasks=1)
        agent = create_agent(Scripted(messages=iter(script)), tools=agent_tools, middleware=[limited])
        agent.invoke({"messages": [("user", QUERY)]})
    assert len(limited.reasked) == 1  # bounded: one re-ask per turn
