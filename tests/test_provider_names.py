"""Provider-safe tool names (issue 21): every name the registry accepts maps to one OpenAI and
Anthropic accept (``^[a-zA-Z0-9_-]{1,64}$``), collision-free and reversible, and the adapters
apply it both ways in request bodies built and responses parsed by the real SDKs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tool_shortlist_client.adapters import anthropic as anthropic_adapter
from tool_shortlist_client.adapters import openai as openai_adapter
from tool_shortlist_client.models import Shortlist
from tool_shortlist_client.names import (
    PROVIDER_NAME_PATTERN,
    ProviderNames,
    UnknownProviderName,
    decode_readable,
    provider_name,
)

ROOT = Path(__file__).resolve().parent.parent
DEMO = json.loads((ROOT / "examples" / "demo_tools.json").read_text())
DEMO_TOOLS: list[dict[str, Any]] = DEMO["tools"] if isinstance(DEMO, dict) else DEMO


def _name(definition: dict[str, Any]) -> str:
    return str((definition.get("function") or definition)["name"])


DEMO_NAMES = [_name(d) for d in DEMO_TOOLS]
ADVERSARIAL = [
    "café", "日本語ツール", "emoji_🔧", "x" * 256, "a/" * 128, "a/b", "a.b", "a__b", "a_/b",
    "a//b", "a/.b", "/", ".", "..", "../../victim", "a b", "a\tb", "tool-1", "-", "_", "__",
    "____", "a____b", "server.tool/sub.name", "x" * 64, "x" * 65, "q" * 63 + "/", "\u0000nul",
]


def test_demo_registry_names_are_readable() -> None:
    mapped = {name: provider_name(name) for name in DEMO_NAMES}
    assert mapped["filesystem/read_file"] == "filesystem__read_file"
    assert mapped["github.create_issue"] == "github___create_issue"
    assert mapped["get_weather"] == "get_weather"
    assert all(PROVIDER_NAME_PATTERN.match(p) for p in mapped.values())
    assert len(set(mapped.values())) == len(mapped)
    names = ProviderNames()
    assert all(names.to_registry(names.to_provider(n)) == n for n in DEMO_NAMES)


def test_adversarial_names_fit_the_pattern_and_round_trip() -> None:
    names = ProviderNames()
    mapped = {name: names.to_provider(name) for name in ADVERSARIAL}
    for name, provider in mapped.items():
        assert PROVIDER_NAME_PATTERN.match(provider), (name, provider)
        assert names.to_registry(provider) == name
    assert len(set(mapped.values())) == len(mapped), "two names mapped alike"
    # names that a naive replacement maps alike stay apart
    assert len({mapped["a/b"], mapped["a.b"], mapped["a__b"], mapped["a_/b"]}) == 4


def test_stable_across_instances_and_orders() -> None:
    first, second = ProviderNames(), ProviderNames()
    forward = [first.to_provider(n) for n in ADVERSARIAL]
    backward = [second.to_provider(n) for n in reversed(ADVERSARIAL)]
    assert forward == list(reversed(backward))


def test_a_hashed_name_never_sent_is_refused_clearly() -> None:
    hashed = provider_name("café")
    assert decode_readable(hashed) is None
    with pytest.raises(UnknownProviderName, match="not sent through this mapping"):
        ProviderNames().to_registry(hashed)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=300), min_size=1, max_size=20, unique=True))
def test_any_names_map_injectively_into_the_pattern(batch: list[str]) -> None:
    names = ProviderNames()
    mapped = [names.to_provider(n) for n in batch]
    assert all(PROVIDER_NAME_PATTERN.match(p) for p in mapped)
    assert len(set(mapped)) == len(batch)
    assert [names.to_registry(p) for p in mapped] == batch


# -- the real SDKs: request bodies out, responses back --------------------------------------------


def _shortlist(definitions: list[dict[str, Any]]) -> Shortlist:
    tools = [
        {"name": _name(d), "rank": i + 1, "score": 1.0, "definition": d}
        for i, d in enumerate(definitions)
    ]
    return Shortlist.model_validate(
        {"shortlist_id": "s1", "registry": "demo", "version": 1, "policy": "bor", "scorer": "hybrid", "k": len(tools),
         "n_tools": len(tools), "p_rand": 0.5, "bor_max_bits": 1.0, "tools": tools}
    )


class _Recorder:
    """An httpx2 transport that keeps each request body and answers with a canned response."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.answer = answer

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.bodies.append(json.loads(request.content))
        return httpx2.Response(200, json=self.answer)


def _adversarial_definitions() -> list[dict[str, Any]]:
    return [*DEMO_TOOLS, *({"name": n, "description": "odd", "parameters": {"type": "object"}}
                           for n in ADVERSARIAL)]


def test_openai_request_body_and_function_call_back() -> None:
    import openai

    definitions = _adversarial_definitions()
    names = ProviderNames()
    item = openai_adapter.output_item(_shortlist(definitions), "call_1", names=names)
    target = names.to_provider("filesystem/read_file")
    answer = {
        "id": "resp_1", "object": "response", "created_at": 0, "model": "gpt-x", "status":
        "completed", "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "output": [{"type": "function_call", "id": "fc_1", "call_id": "c1", "name": target,
                    "arguments": "{}", "status": "completed"}],
    }
    recorder = _Recorder(answer)
    client = openai.OpenAI(api_key="test", base_url="http://provider.invalid/v1",
                           http_client=httpx2.Client(transport=httpx2.MockTransport(recorder)))
    response = client.responses.create(
        model="gpt-x", input=[item], tools=[openai_adapter.tool_search_tool()]
    )
    sent = recorder.bodies[0]["input"][0]["tools"]
    assert len(sent) == len(definitions)
    assert all(PROVIDER_NAME_PATTERN.match(tool["name"]) for tool in sent)
    assert openai_adapter.called_tools(response.output, names) == ["filesystem/read_file"]


def test_anthropic_request_body_and_tool_use_back() -> None:
    import anthropic

    definitions = _adversarial_definitions()
    names = ProviderNames()
    tools = [anthropic_adapter.search_tool(), *anthropic_adapter.deferred_tools(definitions, names)]
    result = anthropic_adapter.result_block(_shortlist(definitions), "toolu_1", names)
    answer = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
        "content": [
            {"type": "tool_use", "id": "toolu_2", "name": "search_tools", "input": {"query": "x"}},
            {"type": "tool_use", "id": "toolu_3", "name": names.to_provider("café"), "input": {}},
            {"type": "tool_use", "id": "toolu_4", "name": names.to_provider("math.factorial"),
             "input": {"n": 5}},
        ],
    }
    recorder = _Recorder(answer)
    client = anthropic.Anthropic(api_key="test", base_url="http://provider.invalid",
                                 http_client=httpx2.Client(transport=httpx2.MockTransport(recorder)))
    message = client.messages.create(
        model="claude-x", max_tokens=16, tools=tools,
        messages=[{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                                     "name": "search_tools", "input": {}}]},
                  {"role": "user", "content": [result]}],
    )
    body = recorder.bodies[0]
    sent_names = [t["name"] for t in body["tools"]]
    references = [b["tool_name"] for b in body["messages"][2]["content"][0]["content"]]
    assert len(sent_names) == len(definitions) + 1
    assert all(PROVIDER_NAME_PATTERN.match(n) for n in sent_names + references)
    assert set(references) <= set(sent_names)  # every reference names a deferred tool
    assert anthropic_adapter.used_tools(message.content, names) == ["café", "math.factorial"]
