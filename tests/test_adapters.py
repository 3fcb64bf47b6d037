"""Framework adapters of the client against a real server, with the real PyPI packages and no
network: the OpenAI SDK's client-executed tool search round trip, Anthropic's custom tool search
with tool_reference (LangGraph bigtool, in a virtualenv of its own: tests/test_bigtool.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import weather_tools
from tool_shortlist_client import AsyncShortlistClient, ShortlistClient

pytestmark = pytest.mark.e2e

WEATHER_QUERY = "what's the weather in Paris tomorrow?"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path):
    from tests.server import Servers

    servers = Servers(tmp_path_factory.mktemp("adapters"), minilm_cache)
    started = servers.start()
    with ShortlistClient(started.url) as admin:
        admin.put_registry("weather", weather_tools())
    yield started
    servers.close()


@pytest.fixture
def client(server):
    with ShortlistClient(server.url, registry="weather") as c:
        yield c


# -- OpenAI Responses / Agents SDK -----------------------------------------------------------------


def _responses_payload(output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "resp_1", "object": "response", "created_at": 0, "model": "gpt-test",
        "status": "completed", "output": output, "parallel_tool_calls": True,
        "tool_choice": "auto", "tools": [],
    }  # fmt: skip


def test_openai_client_tool_search_round_trip(client):
    import httpx2
    import openai
    from agents import Agent, ToolSearchOutputItem
    from agents.models.openai_responses import Converter
    from openai.types.responses import ResponseToolSearchCall, ResponseToolSearchOutputItemParam

    from tool_shortlist_client.adapters import openai as adapter

    sent: list[dict[str, Any]] = []
    search_call = {
        "type": "tool_search_call", "id": "tsc_1", "call_id": "call_ts_1", "execution": "client",
        "status": "completed", "arguments": {"query": WEATHER_QUERY},
    }  # fmt: skip

    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(json.loads(request.content))
        if len(sent) == 1:
            return httpx2.Response(200, json=_responses_payload([search_call]))
        message = {
            "type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}],
        }  # fmt: skip
        return httpx2.Response(200, json=_responses_payload([message]))

    oai = openai.OpenAI(
        api_key="test",
        base_url="http://responses.test/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )
    tools = [adapter.tool_search_tool()]
    first = oai.responses.create(model="gpt-test", input=WEATHER_QUERY, tools=tools)
    assert isinstance(first.output[0], ResponseToolSearchCall)  # the SDK's own type

    outputs = adapter.tool_search_outputs(client, first.output, registry="weather")
    assert len(outputs) == 1
    item = outputs[0]
    assert (item["type"], item["call_id"], item["execution"]) == (
        "tool_search_output",
        "call_ts_1",
        "client",
    )
    names = [tool["name"] for tool in item["tools"]]
    assert names[0] == "get_weather"
    assert item["tools"][0]["parameters"]["properties"] == {"city": {"type": "string"}}

    # The SDKs accept it: openai's model of the item, and the Agents SDK's run item.
    parsed = ResponseToolSearchOutputItemParam.model_validate(item)
    assert [t.name for t in parsed.tools] == names
    run_item = ToolSearchOutputItem(agent=Agent(name="a"), raw_item=dict(item))
    assert run_item.to_input_item()["call_id"] == "call_ts_1"

    second = oai.responses.create(
        model="gpt-test",
        input=[{"role": "user", "content": WEATHER_QUERY}, search_call, *outputs],
        tools=tools,
    )
    assert second.output_text == "Sunny."
    assert sent[0]["tools"] == [adapter.tool_search_tool()]
    assert sent[1]["input"][-1] == json.loads(json.dumps(item))

    # The Agents SDK tool declaration converts to the same Responses tool.
    converted, _ = Converter._convert_tool(adapter.agents_tool_search_tool())
    assert converted == adapter.tool_search_tool()


def test_agents_runner_with_deferred_tools_over_the_service(client):
    """An Agent built from the adapter alone (tool search + the registry's deferred function
    tools) converts and runs in the Agents SDK's runner: the model's client tool search is
    answered by /shortlist (the SDK's runner leaves client search to the caller), then the model
    calls a found tool by its provider-safe name and the runner runs it under its registry name."""
    import httpx2
    import openai
    from agents import Agent, RunConfig, Runner
    from agents.models.openai_responses import OpenAIResponsesModel

    from tool_shortlist_client.adapters import openai as adapter
    from tool_shortlist_client.names import PROVIDER_NAME_PATTERN

    query = "read the file notes.md from disk"
    search_call = {
        "type": "tool_search_call", "id": "tsc_1", "call_id": "call_ts_1", "execution": "client",
        "status": "completed", "arguments": {"query": query},
    }  # fmt: skip
    search_output = adapter.tool_search_outputs(client, [search_call], registry="weather")[0]
    found = [tool["name"] for tool in search_output["tools"]]
    assert found[0] == "fs__read_file"  # the registry's fs/read_file, provider-safe

    sent: list[dict[str, Any]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(json.loads(request.content))
        if len(sent) == 1:
            # as the Responses API calls a deferred top-level tool: its name as its namespace
            call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": found[0],
                    "namespace": found[0], "arguments": json.dumps({"path": "notes.md"}),
                    "status": "completed"}
            return httpx2.Response(200, json=_responses_payload([call]))
        message = {
            "type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
        }  # fmt: skip
        return httpx2.Response(200, json=_responses_payload([message]))

    ran: list[tuple[str, dict[str, Any]]] = []

    def run(name: str, arguments: dict[str, Any]) -> str:
        ran.append((name, arguments))
        return "# notes"

    registry_tools = client.get_registry("weather").tools
    oai = openai.AsyncOpenAI(
        api_key="test", base_url="http://responses.test/v1", max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
    )  # fmt: skip
    agent = Agent(
        name="files",
        model=OpenAIResponsesModel("gpt-test", oai),
        tools=[adapter.agents_tool_search_tool(), *adapter.agents_deferred_tools(registry_tools, run)],
    )
    items = [{"role": "user", "content": query}, search_call, search_output]
    result = asyncio.run(Runner.run(agent, items, run_config=RunConfig(tracing_disabled=True)))

    assert result.final_output == "Done."
    assert ran == [("fs/read_file", {"path": "notes.md"})]
    first_tools = sent[0]["tools"]
    search = [t for t in first_tools if t["type"] == "tool_search"]
    deferred = [t for t in first_tools if t["type"] == "function"]
    assert search and search[0]["execution"] == "client"
    assert len(deferred) == len(registry_tools) and all(t["defer_loading"] for t in deferred)
    assert all(PROVIDER_NAME_PATTERN.match(t["name"]) for t in deferred)
    assert sent[0]["input"][-1]["type"] == "tool_search_output"
    assert adapter.called_tools([sent[1]["input"][-2]]) == ["fs/read_file"]


def test_agents_runner_refuses_a_client_tool_search_mid_run(client):
    """Why the run's input answers the search (above): openai-agents 0.24.0, the newest release,
    raises on a model's client tool_search_call inside Runner.run
    (agents/run_internal/turn_resolution.py). Should a release run client tool search, this
    fails, and the search can then be driven through the runner itself."""
    import httpx2
    import openai
    from agents import Agent, RunConfig, Runner
    from agents.exceptions import ModelBehaviorError
    from agents.models.openai_responses import OpenAIResponsesModel

    from tool_shortlist_client.adapters import openai as adapter

    search_call = {
        "type": "tool_search_call", "id": "tsc_1", "call_id": "call_ts_1", "execution": "client",
        "status": "completed", "arguments": {"query": WEATHER_QUERY},
    }  # fmt: skip

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json=_responses_payload([search_call]))

    oai = openai.AsyncOpenAI(
        api_key="test", base_url="http://responses.test/v1", max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
    )  # fmt: skip
    tools = client.get_registry("weather").tools
    agent = Agent(
        name="weather",
        model=OpenAIResponsesModel("gpt-test", oai),
        tools=[
            adapter.agents_tool_search_tool(),
            *adapter.agents_deferred_tools(tools, lambda name, args: ""),
        ],
    )
    run = Runner.run(agent, WEATHER_QUERY, run_config=RunConfig(tracing_disabled=True))
    with pytest.raises(ModelBehaviorError, match="Client-executed tool_search calls are not"):
        asyncio.run(run)


def test_openai_async_tool_search_output(server):
    from openai.types.responses import ResponseToolSearchCall

    from tool_shortlist_client.adapters.openai import atool_search_output

    call = ResponseToolSearchCall(
        id="tsc_2", call_id="call_2", execution="client", status="completed",
        type="tool_search_call", arguments=json.dumps({"query": "convert 20 euros to yen"}),
    )  # fmt: skip

    async def run():
        async with AsyncShortlistClient(server.url, registry="weather") as aclient:
            return await atool_search_output(aclient, call, max_k=2)

    item = asyncio.run(run())
    assert item["call_id"] == "call_2"
    assert item["tools"][0]["name"] == "convert_currency" and len(item["tools"]) <= 2


# -- Anthropic -----------------------------------------------------------------------------------


def test_anthropic_custom_tool_search_returns_tool_references(client):
    import anthropic
    import httpx2
    from anthropic.types import ToolResultBlockParam, ToolUseBlock
    from pydantic import TypeAdapter

    from tool_shortlist_client.adapters import anthropic as adapter

    sent: list[dict[str, Any]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(json.loads(request.content))
        base = {"id": f"msg_{len(sent)}", "type": "message", "role": "assistant",
                "model": "claude-test", "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
        if len(sent) == 1:
            use = {"type": "tool_use", "id": "toolu_1", "name": "search_tools",
                   "input": {"query": WEATHER_QUERY}}  # fmt: skip
            return httpx2.Response(200, json={**base, "content": [use], "stop_reason": "tool_use"})
        text = {"type": "text", "text": "Sunny."}
        return httpx2.Response(200, json={**base, "content": [text], "stop_reason": "end_turn"})

    claude = anthropic.Anthropic(
        api_key="test",
        base_url="http://messages.test",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )
    tools = [adapter.search_tool(), *adapter.deferred_tools(weather_tools())]
    assert all(t.get("defer_loading") for t in tools[1:]) and "defer_loading" not in tools[0]
    assert tools[1]["input_schema"] == {
        "type": "object",
        "properties": {"city": {"type": "string"}},
    }
    messages: list[Any] = [{"role": "user", "content": WEATHER_QUERY}]
    first = claude.messages.create(
        model="claude-test", max_tokens=64, tools=tools, messages=messages
    )
    uses = adapter.search_uses(first.content)
    assert len(uses) == 1 and isinstance(uses[0], ToolUseBlock)

    results = [adapter.tool_search_result(client, use, registry="weather") for use in uses]
    result = results[0]
    TypeAdapter(ToolResultBlockParam).validate_python(result)  # the SDK's block type
    assert result["tool_use_id"] == "toolu_1"
    references = list(result["content"])
    assert references[0] == {"type": "tool_reference", "tool_name": "get_weather"}
    assert all(block["type"] == "tool_reference" for block in references)

    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": results},
    ]
    second = claude.messages.create(
        model="claude-test", max_tokens=64, tools=tools, messages=messages
    )
    assert second.content[0].text == "Sunny."
    assert sent[1]["messages"][-1]["content"][0]["content"] == references
    assert sent[1]["messages"][1]["content"][0]["name"] == "search_tools"


def test_anthropic_empty_shortlist_answers_with_text(client):
    from tool_shortlist_client.adapters.anthropic import result_block
    from tool_shortlist_client.models import Shortlist

    shortlist = client.shortlist("xyzzy", k=1)
    empty = Shortlist.model_validate({**shortlist.model_dump(), "k": 0, "tools": []})
    block = result_block(empty, "toolu_9")
    assert block["content"] == [
        {"type": "text", "text": "No tool in the catalogue fits this request."}
    ]
