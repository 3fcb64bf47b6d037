"""docs/client.md's client and adapter blocks, executed as written against a real server with tokens
(the names each block assumes, such as ``client``, ``llm`` or ``oai``, are bound to real SDK
objects; model backends are fakes, the shortlists come from the service). The LangChain block
runs in tests/test_langchain_middleware.py, the bigtool one in tests/test_bigtool.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.doc_examples import client_doc_block
from tests.test_langchain_middleware import PAYMENTS
from tool_shortlist_client import ShortlistClient

pytestmark = pytest.mark.e2e

ADMIN, QUERY = "readme-admin", "readme-query"
REQUEST = "refund order 1234"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path):
    from tests.server import Servers

    servers = Servers(tmp_path_factory.mktemp("readme"), minilm_cache)
    started = servers.start(admin_token=ADMIN, query_token=QUERY, explore_share="0")
    yield started
    servers.close()


def run_block(name: str, namespace: dict[str, Any]) -> dict[str, Any]:
    exec(compile(client_doc_block(f"adapter:{name}"), f"docs/client.md:{name}", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def client_block(server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The client block, with its tools.json and tokens, against the server (not :8080)."""
    import os

    work = tmp_path_factory.mktemp("readme-client")
    (work / "tools.json").write_text(json.dumps(PAYMENTS))
    code = client_doc_block("adapter:client").replace("http://127.0.0.1:8080", server.url)
    namespace: dict[str, Any] = {"QUERY_TOKEN": QUERY, "ADMIN_TOKEN": ADMIN}
    here = os.getcwd()
    os.chdir(work)
    try:
        exec(compile(code, "docs/client.md:client", "exec"), namespace)
    finally:
        os.chdir(here)
    return namespace


@pytest.fixture
def client(server, client_block):
    with ShortlistClient(server.url, token=QUERY, admin_token=ADMIN) as c:
        yield c


def test_the_client_block(client_block):
    shortlist, report = client_block["shortlist"], client_block["report"]
    assert shortlist.registry == "payments" and shortlist.depth_bias == 0.25
    assert shortlist.names[0] == "refund_payment" and client_block["tools"] == shortlist.definitions
    # tools.json (version 1), then the upsert replaced its get_balance (version 2)
    assert (shortlist.version, shortlist.n_tools) == (2, len(PAYMENTS))
    row = next(tool for tool in report.tools if tool.name == "refund_payment")
    assert (report.events, row.used, row.useful_calls) == (1, 1, 1)


def test_the_openai_block(client):
    import httpx2
    import openai

    sent: list[dict[str, Any]] = []
    search_call = {
        "type": "tool_search_call", "id": "tsc_1", "call_id": "call_ts_1", "execution": "client",
        "status": "completed", "arguments": {"query": REQUEST},
    }  # fmt: skip
    message = {
        "type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "Refunded.", "annotations": []}],
    }  # fmt: skip

    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(json.loads(request.content))
        output = [search_call] if len(sent) == 1 else [message]
        return httpx2.Response(200, json={
            "id": f"resp_{len(sent)}", "object": "response", "created_at": 0, "model": "gpt-test",
            "status": "completed", "output": output, "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [],
        })  # fmt: skip

    oai = openai.OpenAI(
        api_key="test", base_url="http://responses.test/v1", max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )  # fmt: skip
    items: list[Any] = [{"role": "user", "content": REQUEST}]
    namespace = run_block("openai", {"oai": oai, "MODEL": "gpt-test", "items": items,
                                     "client": client})  # fmt: skip
    assert namespace["response"].output_text == "Refunded."
    answered = sent[1]["input"][-1]
    assert answered["type"] == "tool_search_output" and answered["call_id"] == "call_ts_1"
    assert answered["tools"][0]["name"] == "refund_payment"


def test_the_anthropic_block(client):
    import anthropic
    import httpx2

    def handler(request: httpx2.Request) -> httpx2.Response:
        use = {"type": "tool_use", "id": "toolu_1", "name": "search_tools",
               "input": {"query": REQUEST}}  # fmt: skip
        return httpx2.Response(200, json={
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
            "usage": {"input_tokens": 1, "output_tokens": 1}, "content": [use],
            "stop_reason": "tool_use",
        })  # fmt: skip

    claude = anthropic.Anthropic(
        api_key="test", base_url="http://messages.test", max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )  # fmt: skip
    messages: list[Any] = [{"role": "user", "content": REQUEST}]
    namespace = run_block("anthropic", {"claude": claude, "MODEL": "claude-test",
                                        "messages": messages, "client": client})  # fmt: skip
    assert [t["name"] for t in namespace["tools"]][:2] == ["search_tools", "refund_payment"]
    result = messages[-1]["content"][0]
    assert result["tool_use_id"] == "toolu_1"
    assert result["content"][0] == {"type": "tool_reference", "tool_name": "refund_payment"}
