"""The MCP face at /mcp: the official SDK client (mcp 2.x) over real HTTP against a real server
(real MiniLM, real ONNX policy), plus the face's error and text paths in-process."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import httpx2
import pytest

from tests.cores import new_core

QUERY_TOKEN = "query-token-for-mcp-tests-0123"
ADMIN_TOKEN = "admin-token-for-mcp-tests-4567"
T = TypeVar("T")


def with_session(url: str, token: str | None, use: Callable[[Any], Awaitable[T]]) -> T:
    """Open an SDK session on ``url``/mcp (bearer ``token``), initialise it, run ``use``."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def main() -> T:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            info = await session.initialize()
            assert info.server_info.name == "tool-shortlist"
            return await use(session)

    return anyio.run(main)


def demo_tools() -> bytes:
    from registry.settings import Settings

    return Path(str(Settings().demo_registry)).read_bytes()


@pytest.fixture
def server(server_factory):
    """A real server with tokens and the demo tools uploaded as registry 'demo'."""
    server = server_factory(query_token=QUERY_TOKEN, admin_token=ADMIN_TOKEN)
    demo = demo_tools()
    put = httpx.put(
        f"{server.url}/registries/demo",
        content=demo,
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
        timeout=120,
    )
    assert put.status_code == 200, put.text
    return server


@pytest.mark.e2e
def test_find_tools_then_report_tool_use(server):
    async def use(session) -> dict[str, Any]:
        listed = await session.list_tools()
        find = await session.call_tool(
            "find_tools", {"query": "what's the weather in Paris tomorrow?"}
        )
        fixed = await session.call_tool(
            "find_tools", {"query": "convert 20 euros to yen", "registry": "demo", "k": 3}
        )
        shortlist_id = find.structured_content["shortlist_id"]
        used = find.structured_content["tools"][0]["name"]
        report = await session.call_tool(
            "report_tool_use",
            {"shortlist_id": shortlist_id, "used": [used], "success": True,
             "calls": [{"tool": used, "useful": True}]},
        )
        resent = await session.call_tool(
            "report_tool_use", {"shortlist_id": shortlist_id, "used": [used]}
        )
        listed_again = await session.list_tools()
        return {"listed": listed, "find": find, "fixed": fixed, "report": report,
                "resent": resent, "listed_again": listed_again}

    out = with_session(server.url, QUERY_TOKEN, use)

    tools = {tool.name: tool for tool in out["listed"].tools}
    assert set(tools) == {"find_tools", "report_tool_use"}
    assert "query" in tools["find_tools"].input_schema["properties"]  # or queries: either one
    assert {"query", "registry", "k", "max_k", "limit", "depth_bias", "allow_empty"} <= set(
        tools["find_tools"].input_schema["properties"]
    )
    assert "shortlist_id" in tools["find_tools"].output_schema["properties"]
    assert set(tools["report_tool_use"].input_schema["required"]) == {"shortlist_id", "used"}
    # tools/list never varies per request: shortlists travel in tools/call results
    assert out["listed_again"].model_dump() == out["listed"].model_dump()

    find = out["find"]
    assert not find.is_error
    body = find.structured_content
    assert body["registry"] == "demo" and body["policy"] == "bor" and body["n_tools"] == 30
    names = [tool["name"] for tool in body["tools"]]
    assert 1 <= body["k"] == len(names) <= 15
    assert {"get_weather", "get_weather_forecast"} & set(names[:2])
    assert [tool["rank"] for tool in body["tools"]] == sorted(t["rank"] for t in body["tools"])
    uploaded = {
        (d.get("name") or d["function"]["name"]): d for d in json.loads(demo_tools())["tools"]
    }
    assert all(tool["definition"] == uploaded[tool["name"]] for tool in body["tools"])
    assert 0 < body["p_rand"] <= 1 and isinstance(body["intents"], list)
    # the spec's SHOULD: structured content is also serialised as JSON in a text block
    assert json.loads(find.content[0].text) == body
    text = find.content[1].text
    assert body["shortlist_id"] in text and all(name in text for name in names)
    assert json.loads(out["report"].content[0].text) == out["report"].structured_content

    fixed = out["fixed"].structured_content
    assert fixed["k"] == 3 and fixed["policy"] == "fixed"
    assert fixed["tools"][0]["name"] == "convert_currency"

    report = out["report"]
    assert not report.is_error, report.content
    assert report.structured_content["presented"] == {"exact": True, "equivalent": True}
    assert report.structured_content["duplicate"] is False
    assert report.structured_content["p_rand"]["exact"] == pytest.approx(body["k"] / 30)
    assert out["resent"].structured_content["duplicate"] is True

    # One core behind both faces: HTTP sees the MCP feedback and the same ranking.
    auth = {"Authorization": f"Bearer {QUERY_TOKEN}"}
    counts = httpx.get(f"{server.url}/registries/demo/report", headers=auth).json()
    assert counts["events"] == 1 and counts["mean_trajectory_efficiency"] == 1.0
    # MCP feedback names its caller (the token's hash), so with tokens set the learning loop
    # counts it instead of skipping it as untrusted.
    learning = counts["learning"]
    assert learning["events"] == 1 and "untrusted" not in learning["skipped"], learning
    assert [share["caller"] is not None for share in learning["caller_shares"]] == [True]
    http = httpx.post(
        f"{server.url}/shortlist",
        json={"registry": "demo", "query": "what's the weather in Paris tomorrow?"},
        headers=auth,
    ).json()
    assert [tool["name"] for tool in http["tools"]] == names
    metrics = httpx.get(f"{server.url}/metrics", headers=auth).text  # tokens set: one is needed
    assert 'shortlist_requests_total{policy="bor",registry="demo"} 2.0' in metrics
    assert 'route="/mcp"' in metrics and 'shortlist_feedback_total{registry="demo"} 1.0' in metrics


@pytest.mark.e2e
def test_errors_are_tool_errors_with_the_service_error_type(server):
    async def use(session) -> list[Any]:
        return [
            await session.call_tool("find_tools", {"query": "weather", "registry": "nope"}),
            await session.call_tool("find_tools", {"query": "weather", "k": 0}),
            await session.call_tool("find_tools", {"query": "weather", "k": 2, "depth_bias": 1}),
            await session.call_tool("find_tools", {"query": "   "}),
            await session.call_tool("report_tool_use", {"shortlist_id": "never", "used": ["x"]}),
            await session.call_tool("no_such_tool", {}),
        ]

    missing, bad_k, bias_with_k, blank, unknown_id, no_tool = with_session(
        server.url, ADMIN_TOKEN, use  # an admin token queries too, as on HTTP
    )
    for result, error_type in (
        (missing, "not_found"), (bad_k, "validation"), (bias_with_k, "validation"),
        (blank, "validation"), (unknown_id, "not_found"), (no_tool, "not_found"),
    ):
        assert result.is_error, result
        assert result.content[0].text.startswith(f"{error_type}: "), result.content[0].text
        assert result.structured_content["error"]["type"] == error_type
    assert "registry 'nope' does not exist" in missing.content[0].text
    assert missing.structured_content["error"]["details"] == {"registry": "nope"}
    assert "k" in bad_k.content[0].text


@pytest.mark.e2e
def test_tokens_apply_as_on_http(server):
    initialize = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "0"}},
    }
    headers = {"Accept": "application/json, text/event-stream"}
    for token, reason in ((None, "missing_token"), ("wrong", "invalid_token")):
        sent = dict(headers, **({"Authorization": f"Bearer {token}"} if token else {}))
        response = httpx.post(f"{server.url}/mcp", json=initialize, headers=sent)
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        error = response.json()["error"]
        assert error["type"] == "unauthorized" and error["details"]["reason"] == reason

    async def names(session) -> list[str]:
        return [tool.name for tool in (await session.list_tools()).tools]

    with pytest.raises(BaseException) as failure:  # the SDK surfaces the 401 as an error
        with_session(server.url, "wrong", names)
    # mcp 2.x reports an HTTP error answer as MCPError "Server returned an error response"
    assert any(s in repr(failure.value) for s in ("401", "Unauthorized", "error response"))
    assert with_session(server.url, QUERY_TOKEN, names) == ["find_tools", "report_tool_use"]


def test_odd_ids_and_transport_errors_get_json_answers(server):
    """An id MCP forbids gets a JSON-RPC error (the SDK would answer a silent 202); the SDK's
    plain-text 413 and 400 come back in the service's JSON error shape; a foreign Host 421."""
    sent = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {QUERY_TOKEN}"}
    url = f"{server.url}/mcp"
    for odd in ({"a": 1}, [1], 1.5, None):
        r = httpx.post(url, json={"jsonrpc": "2.0", "id": odd, "method": "tools/list"}, headers=sent)
        assert r.status_code == 400, (odd, r.status_code, r.text)
        assert r.json()["error"]["code"] == -32600 and "id must be a string or an integer" in r.text
    batch = [{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"jsonrpc": "2.0", "id": {}, "method": "x"}]
    assert httpx.post(url, json=batch, headers=sent).status_code == 400
    fine = httpx.post(url, json={"jsonrpc": "2.0", "id": "s", "method": "tools/list"}, headers=sent)
    assert fine.status_code == 200 and fine.json()["id"] == "s"

    big = httpx.post(url, content=b"[" + b" " * (5 * 1024 * 1024) + b"]",
                     headers={**sent, "content-type": "application/json"}, timeout=30)
    assert big.status_code == 413 and big.json()["error"]["type"] == "payload_too_large", big.text
    text = httpx.post(url, content=b"{}", headers={**sent, "content-type": "text/plain"})
    assert text.status_code == 400 and text.json()["error"]["type"] == "bad_request", text.text
    rebound = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         headers={**sent, "Host": "evil.example.com"})
    assert rebound.status_code == 421 and rebound.json()["error"]["type"] == "misdirected_request"


def test_find_tools_before_the_core_is_ready_is_an_unhealthy_tool_error(settings, bor_policy):
    from service.mcp import McpFace

    core = new_core(settings, bor_policy=bor_policy, start=False)  # never started
    face = McpFace(core, settings)
    result = anyio.run(face._call_tool, "find_tools", {"query": "weather in Paris"})
    assert result.is_error
    assert result.content[0].text.startswith("unhealthy: service not ready")
    assert result.structured_content["error"]["type"] == "unhealthy"


def test_the_text_block_says_when_no_tool_fits():
    from registry.serving.result import Shortlist
    from service.mcp import shortlist_text

    empty = Shortlist("abc", "demo", 3, "bor", "hybrid", 0, 30, 0.0, 4.9, [], confidence=0.12)
    text = shortlist_text(empty)
    assert text.splitlines() == [
        "0 of 30 tools from registry 'demo' (v3, policy bor, P_rand 0):",
        "no tool fits this request (confidence 0.12)",
        "shortlist_id: abc (quote it in report_tool_use)",
    ]


@pytest.mark.e2e
def test_find_tools_caps_and_depth_bias(server):
    """``max_k`` and ``limit`` (what models often send) cap the list; the policy still chooses
    below the cap; ``depth_bias`` moves the depth."""
    query = "find something useful for my trip"

    async def use(session) -> list[Any]:
        return [
            await session.call_tool("find_tools", {"query": query, "depth_bias": 3.0}),
            await session.call_tool("find_tools", {"query": query, "depth_bias": 3.0, "limit": 2}),
            await session.call_tool(
                "find_tools", {"query": query, "depth_bias": 3.0, "max_k": 3, "limit": 1}
            ),
            await session.call_tool("find_tools", {"query": query, "depth_bias": -3.0}),
            await session.call_tool("find_tools", {"query": query, "limit": 0}),
        ]

    deep, limited, both, shallow, bad = with_session(server.url, QUERY_TOKEN, use)
    assert not any(r.is_error for r in (deep, limited, both, shallow))
    deep_k = deep.structured_content["k"]
    assert deep_k > 2, deep.structured_content  # so that the caps below bind
    assert limited.structured_content["k"] == 2
    assert both.structured_content["k"] == 1
    assert shallow.structured_content["k"] < deep_k
    assert deep.structured_content["depth_bias"] == 3.0
    assert bad.is_error and bad.structured_content["error"]["type"] == "validation"
    assert "limit" in bad.content[0].text


@pytest.mark.e2e
def test_mcp_calls_are_quiet_at_info(server_factory):
    """At INFO an MCP call logs its access line like any HTTP request, and nothing else (the
    SDK's per-request chatter is dropped)."""
    server = server_factory(log_level="info")

    async def use(session) -> None:
        for _ in range(3):
            await session.list_tools()
            await session.call_tool("find_tools", {"query": "weather in Paris"})

    deadline = time.monotonic() + 60  # the start-up's own INFO lines end with "ready in"
    while "ready in" not in server.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    before = server.log_path.read_text().splitlines()
    with_session(server.url, None, use)
    after = server.log_path.read_text().splitlines()[len(before):]
    noisy = [line for line in after if (" INFO " in line or " DEBUG " in line)
             and " uvicorn.access: " not in line]
    assert noisy == [], noisy
    assert sum('"POST /mcp HTTP/1.1" 200' in line for line in after) >= 6
