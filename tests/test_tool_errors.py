"""registry.tools refusing bad payloads: one clear problem per fault, every problem collected,
sizes and limits (formats and properties: tests/test_tools.py)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from registry.errors import InvalidToolDefinition, PayloadTooLarge
from registry.tool_text import tool_text
from registry.tools import Tool, ToolLimits, parse_tools
from tests.tool_payloads import SCHEMA, one_problem, openai, problems

# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [None, 3, "tools", {"name": "a"}, {"tool": []}, True])
def test_bad_payload_shape(payload: Any) -> None:
    p = one_problem(payload)
    assert (p["index"], p["tool"], p["field"]) == (None, None, "tools")


def test_tools_key_not_array() -> None:
    p = one_problem({"tools": {"name": "a"}})
    assert (p["index"], p["field"]) == (None, "tools")
    assert "array" in p["message"]


@pytest.mark.parametrize("item", [3, "a", None, [], [{"name": "a"}], True])
def test_tool_not_an_object(item: Any) -> None:
    p = one_problem([{"name": "ok"}, item])
    assert (p["index"], p["tool"], p["field"]) == (1, None, "")


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"description": "no name"}, "name"),
        ({"name": ""}, "name"),
        ({"name": 5}, "name"),
        ({"name": None}, "name"),
        ({"name": ["a"]}, "name"),
        ({"name": "", "input_schema": {}}, "name"),
        ({"name": 1, "inputSchema": {}}, "name"),
        (openai(""), "function.name"),
        (openai(None), "function.name"),
        ({"type": "function", "function": {"description": "x"}}, "function.name"),
    ],
)
def test_bad_name(item: dict[str, Any], field: str) -> None:
    p = one_problem([{"name": "ok"}, item])
    assert (p["index"], p["tool"], p["field"]) == (1, None, field)
    assert "non-empty string" in p["message"]


@pytest.mark.parametrize("char", ["\x00", "\n", "\t", "\x1f", "\x7f"])
def test_control_characters_in_name(char: str) -> None:
    name = f"bad{char}name"
    p = one_problem([{"name": name}])
    assert (p["index"], p["tool"], p["field"]) == (0, name, "name")
    assert "control" in p["message"] and "position 3" in p["message"]


def test_name_too_long() -> None:
    limits = ToolLimits(max_name_chars=10)
    assert parse_tools([{"name": "a" * 10}], limits)[0].name == "a" * 10
    p = one_problem([{"name": "a" * 11}], limits)
    assert (p["index"], p["field"]) == (0, "name")
    assert "10" in p["message"] and "11" in p["message"]
    p = one_problem([openai("b" * 257)])
    assert p["field"] == "function.name"
    assert len(p["tool"]) <= 257  # the echoed name is truncated


@pytest.mark.parametrize("value", [5, [], {}, True])
def test_bad_description(value: Any) -> None:
    p = one_problem([{"name": "a", "description": value}])
    assert (p["index"], p["tool"], p["field"]) == (0, "a", "description")
    details = problems([openai("b", description=value)])
    assert [(d["index"], d["field"]) for d in details] == [(0, "function.description")]


def test_description_too_long() -> None:
    limits = ToolLimits(max_description_chars=20)
    assert parse_tools([{"name": "a", "description": "x" * 20}], limits)
    p = one_problem([{"name": "a", "description": "x" * 21}], limits)
    assert (p["index"], p["field"]) == (0, "description")


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"name": "a", "parameters": []}, "parameters"),
        ({"name": "a", "parameters": "object"}, "parameters"),
        ({"name": "a", "input_schema": 3}, "input_schema"),
        ({"name": "a", "inputSchema": [{}]}, "inputSchema"),
        (openai("a", parameters=True), "function.parameters"),
        ({"type": "function", "name": "a", "parameters": []}, "parameters"),
    ],
)
def test_bad_schema(item: dict[str, Any], field: str) -> None:
    p = one_problem([item])
    assert (p["index"], p["tool"], p["field"]) == (0, "a", field)
    assert "object" in p["message"]


def test_openai_wrong_type() -> None:
    p = one_problem([{"type": "tool", "function": {"name": "a"}}])
    assert (p["index"], p["tool"], p["field"]) == (0, "a", "type")
    p = one_problem([{"name": "ok"}, {"type": "web_search_20250305", "name": "web_search"}])
    assert (p["index"], p["tool"], p["field"]) == (1, "web_search", "type")


@pytest.mark.parametrize("function", [None, "a", [], 3])
def test_openai_function_not_object(function: Any) -> None:
    p = one_problem([{"type": "function", "function": function}])
    assert (p["index"], p["tool"], p["field"]) == (0, None, "function")


def test_openai_function_missing() -> None:
    p = one_problem([{"type": "function", "description": "no function, no name"}])
    assert (p["index"], p["field"]) == (0, "function")


def test_tool_too_large() -> None:
    item = {"name": "big", "description": "x" * 300}
    size = len(json.dumps(item, separators=(",", ":")))
    assert parse_tools([item], ToolLimits(max_tool_bytes=size))
    p = one_problem([item], ToolLimits(max_tool_bytes=size - 1))
    assert (p["index"], p["tool"], p["field"]) == (0, "big", "")
    assert str(size) in p["message"]


def test_tool_size_counts_utf8_bytes() -> None:
    item = {"name": "é" * 10}
    size = len(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode())
    assert parse_tools([item], ToolLimits(max_tool_bytes=size))
    assert one_problem([item], ToolLimits(max_tool_bytes=size - 1))["field"] == ""


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {1, 2}, b"bytes", "\ud800"])
def test_non_json_values_rejected(value: Any) -> None:
    p = one_problem([{"name": "a", "x": {"y": value}}])
    assert (p["index"], p["tool"], p["field"]) == (0, "a", "")


def test_duplicates_every_occurrence_names_first() -> None:
    details = problems(
        [{"name": "a"}, {"name": "b"}, openai("a"), {"name": "a", "inputSchema": {}}, {"name": "b"}]
    )
    assert [(d["index"], d["tool"], d["field"]) for d in details] == [
        (2, "a", "function.name"),
        (3, "a", "name"),
        (4, "b", "name"),
    ]
    assert "tools[0]" in details[0]["message"] and "tools[0]" in details[1]["message"]
    assert "tools[1]" in details[2]["message"]


def test_duplicate_of_otherwise_invalid_tool_is_reported() -> None:
    details = problems([{"name": "a", "description": 1}, {"name": "a"}])
    assert [(d["index"], d["field"]) for d in details] == [(0, "description"), (1, "name")]


def test_names_are_case_sensitive() -> None:
    assert len(parse_tools([{"name": "a"}, {"name": "A"}])) == 2


def test_every_problem_collected_and_summarised() -> None:
    payload = [
        {"name": "ok"},
        7,
        {"name": "", "description": 3, "parameters": []},
        openai("x", parameters="no"),
        {"type": "nope", "function": {"name": "y"}},
    ]
    with pytest.raises(InvalidToolDefinition) as info:
        parse_tools(payload)
    details = info.value.details
    assert [(d["index"], d["field"]) for d in details] == [
        (1, ""),
        (2, "name"),
        (2, "description"),
        (2, "parameters"),
        (3, "function.parameters"),
        (4, "type"),
    ]
    message = info.value.message
    assert message.startswith("6 problems in 4 tools: ")
    assert "tools[2].name: must be a non-empty string" in message
    assert "tools[4].type" in message
    assert info.value.error_type == "validation"
    assert set(details[0]) == {"index", "tool", "field", "message"}


def test_long_problem_list_is_cut_in_message_not_details() -> None:
    with pytest.raises(InvalidToolDefinition) as info:
        parse_tools([1] * 30)
    assert len(info.value.details) == 30
    assert info.value.message.startswith("30 problems in 30 tools: ")
    assert "and 20 more" in info.value.message


def test_too_many_tools() -> None:
    limits = ToolLimits(max_tools=3)
    assert len(parse_tools([{"name": str(i)} for i in range(3)], limits)) == 3
    with pytest.raises(PayloadTooLarge) as info:
        # Invalid items too: the count is checked before per-tool work.
        parse_tools({"tools": [1, 2, 3, 4]}, limits)
    assert "4" in info.value.message and "3" in info.value.message
    assert info.value.details == {"count": 4, "limit": 3}


def test_default_limits() -> None:
    limits = ToolLimits()
    assert (limits.max_tools, limits.max_tool_bytes) == (50_000, 256 * 1024)
    assert (limits.max_description_chars, limits.max_name_chars) == (32_768, 256)


def test_tool_text_and_hash_cached_on_tool() -> None:
    [tool] = parse_tools([{"name": "math.factorial", "description": "Fact.", "parameters": SCHEMA}])
    assert tool.text() == tool_text("math.factorial", "Fact.", SCHEMA)
    assert tool.text() is tool.text()
    assert tool.content_hash() == hashlib.sha256(tool.text().encode()).hexdigest()
    assert len(tool.content_hash()) == 64


def test_content_hash_depends_on_text_only() -> None:
    a = Tool("f", "d", SCHEMA, {"name": "f"}, "plain")
    b = Tool("f", "d", SCHEMA, {"type": "function", "function": {"name": "f"}}, "openai")
    c = Tool("f", "other", SCHEMA, {"name": "f"}, "plain")
    assert a.content_hash() == b.content_hash() != c.content_hash()


def test_tool_is_frozen() -> None:
    tool = Tool("f", "", {}, {"name": "f"}, "plain")
    with pytest.raises(AttributeError):
        tool.name = "g"  # type: ignore[misc]


def test_lone_surrogate_in_direct_tool_does_not_break_hash() -> None:
    tool = Tool("f\ud800", "", {}, {}, "plain")
    assert "\ufffd" in tool.text() and len(tool.content_hash()) == 64
