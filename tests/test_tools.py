"""Unit and property tests for registry.tools: formats and properties (refused payloads:
tests/test_tool_errors.py; registry names: tests/test_names.py; the index text:
tests/test_tool_text.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.errors import InvalidToolDefinition, PayloadTooLarge
from registry.name_checks import url_name_problem
from registry.tools import MAX_JSON_DEPTH, ToolLimits, parse_tools
from tests.tool_payloads import SCHEMA, openai

FIXTURES = Path(__file__).parent / "fixtures"


# --- formats ---------------------------------------------------------------------------


def test_openai_format() -> None:
    item = openai("get_weather", description="Weather now.", parameters=SCHEMA, strict=True)
    [tool] = parse_tools([item])
    assert tool.name == "get_weather"
    assert tool.description == "Weather now."
    assert tool.parameters == SCHEMA
    assert tool.format == "openai"
    assert tool.definition == item


def test_openai_flat_responses_api_form() -> None:
    item = {"type": "function", "name": "f", "description": "d", "parameters": SCHEMA}
    [tool] = parse_tools([item])
    assert (tool.name, tool.description, tool.format) == ("f", "d", "openai")
    assert tool.parameters == SCHEMA


def test_plain_format() -> None:
    item = {"name": "math.factorial", "description": "Factorial.", "parameters": SCHEMA}
    [tool] = parse_tools([item])
    assert (tool.name, tool.parameters, tool.format) == ("math.factorial", SCHEMA, "plain")


def test_anthropic_format() -> None:
    item = {"name": "send", "description": "Send.", "input_schema": SCHEMA}
    [tool] = parse_tools([item])
    assert (tool.name, tool.parameters, tool.format) == ("send", SCHEMA, "anthropic")


def test_anthropic_custom_type_accepted() -> None:
    [tool] = parse_tools([{"type": "custom", "name": "x", "input_schema": SCHEMA}])
    assert tool.format == "anthropic"


def test_mcp_format() -> None:
    item = {
        "name": "github/create_issue",
        "title": "Create issue",
        "description": "Open an issue.",
        "inputSchema": SCHEMA,
        "annotations": {"readOnlyHint": False},
    }
    [tool] = parse_tools([item])
    assert (tool.name, tool.parameters, tool.format) == ("github/create_issue", SCHEMA, "mcp")


def test_optional_fields_default() -> None:
    tools = parse_tools(
        [
            {"name": "a"},
            {"name": "b", "description": None, "parameters": None},
            openai("c"),
            openai("d", description=None, parameters=None),
            {"name": "e", "inputSchema": None},
            {"name": "f", "input_schema": None},
        ]
    )
    assert [(t.description, t.parameters) for t in tools] == [("", {})] * 6
    assert [t.format for t in tools] == ["plain", "plain", "openai", "openai", "mcp", "anthropic"]


def test_mixed_formats_fixture_with_tools_key() -> None:
    payload = json.loads((FIXTURES / "tools_mixed.json").read_text())
    original = copy.deepcopy(payload)
    tools = parse_tools(payload)  # the "equivalents" key is ignored, not rejected
    assert [t.name for t in tools] == [
        "getWeatherForecast",
        "math.factorial",
        "send_email",
        "github/create_issue",
    ]
    assert [t.format for t in tools] == ["openai", "plain", "anthropic", "mcp"]
    assert [t.definition for t in tools] == original["tools"]
    assert payload == original  # parsing does not mutate
    assert tools[0].definition["function"]["strict"] is True
    assert tools[2].definition["cache_control"] == {"type": "ephemeral"}
    assert tools[3].definition["annotations"]["openWorldHint"] is True


def test_bare_array_and_object_forms_agree() -> None:
    items = [{"name": "a"}, openai("b")]
    assert parse_tools(items) == parse_tools({"tools": items, "nextCursor": "x"})


def test_definitions_returned_exactly() -> None:
    items = [
        openai("a", parameters=SCHEMA, x_extra={"nested": [1, 2.5, None, True]}),
        {"name": "b", "unknown": "kept", "parameters": {"weird": []}, "more": [{"a": {}}]},
    ]
    original = copy.deepcopy(items)
    assert [t.definition for t in parse_tools(items)] == original


def test_empty_list_is_valid() -> None:
    assert parse_tools([]) == []
    assert parse_tools({"tools": []}) == []


@pytest.mark.parametrize(
    "name",
    ["math.factorial", "github/create_issue", "météo_prévision", "天气预报", "a-b:c@v2", "x", "🙂"],
)
def test_unusual_names_accepted(name: str) -> None:
    [tool] = parse_tools([{"name": name}])
    assert tool.name == name


# --- properties ------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
finite_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
tool_keys = st.sampled_from(
    ["name", "description", "parameters", "input_schema", "inputSchema", "type", "function", "x"]
)
tool_like = st.dictionaries(tool_keys, json_values | st.just("function"), max_size=5)
payloads = (
    json_values
    | st.lists(tool_like | json_values, max_size=6)
    | st.fixed_dictionaries({"tools": st.lists(tool_like, max_size=6)})
)


@settings(max_examples=200, deadline=None)
@given(payloads)
def test_parse_tools_only_raises_domain_errors(payload: Any) -> None:
    try:
        tools = parse_tools(payload, ToolLimits(max_tools=5))
    except (InvalidToolDefinition, PayloadTooLarge) as exc:
        assert exc.message
        return
    for tool in tools:
        assert isinstance(tool.text(), str) and len(tool.content_hash()) == 64


# Names a URL can carry faithfully (issue 23 item 1 refuses the others; tested on their own).
names = st.text(st.characters(exclude_categories=["Cs", "Cc"]), min_size=1, max_size=40).filter(
    lambda name: url_name_problem(name) is None
)
descriptions = st.none() | st.text(st.characters(exclude_categories=["Cs"]), max_size=60)
schemas = st.none() | st.fixed_dictionaries(
    {"type": st.just("object")},
    optional={
        "properties": st.dictionaries(
            st.text(max_size=10),
            st.fixed_dictionaries({}, optional={"description": st.text(max_size=20)}),
            max_size=4,
        )
    },
)


@st.composite
def valid_tool(draw: st.DrawFn, name: str) -> dict[str, Any]:
    description = draw(descriptions)
    schema = draw(schemas)
    fmt = draw(st.sampled_from(["openai", "flat", "plain", "anthropic", "mcp"]))
    extra = draw(st.dictionaries(st.sampled_from(["x_meta", "title", "strict"]), finite_scalars))
    if fmt == "openai":
        return {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": schema, **extra},
        }
    base: dict[str, Any] = {"name": name, "description": description, **extra}
    if fmt == "flat":
        return {"type": "function", **base, "parameters": schema}
    key = {"plain": "parameters", "anthropic": "input_schema", "mcp": "inputSchema"}[fmt]
    return {**base, key: schema if schema is not None else {}}


@settings(max_examples=150, deadline=None)
@given(
    st.lists(names, max_size=8, unique=True).flatmap(
        lambda ns: st.tuples(*(valid_tool(n) for n in ns)).map(list)
    ),
    st.booleans(),
)
def test_valid_tools_round_trip(items: list[dict[str, Any]], wrapped: bool) -> None:
    expected = copy.deepcopy(items)
    tools = parse_tools({"tools": items} if wrapped else items)
    assert [t.definition for t in tools] == expected
    assert [t.name for t in tools] == [
        item["function"]["name"] if "function" in item else item["name"] for item in expected
    ]


# --- properties: the limits of issue 6 ------------------------------------------------------

def json_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(json_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(json_depth, value), default=0)
    return 0


@st.composite
def nested_values(draw: st.DrawFn) -> Any:
    """A JSON value nested 0-200 levels, in a random mix of arrays and objects."""
    value: Any = draw(finite_scalars)
    for kind in draw(st.lists(st.booleans(), max_size=200)):
        value = [value] if kind else {draw(st.text(max_size=3)): value}
    return value


@settings(max_examples=150, deadline=None)
@given(nested_values(), st.integers(min_value=3, max_value=MAX_JSON_DEPTH))
def test_nesting_is_rejected_exactly_above_the_depth_limit(schema: Any, limit: int) -> None:
    tool = {"name": "t", "parameters": {"type": "object", "x": schema}}
    depth = json_depth(tool)
    try:
        parse_tools([tool], ToolLimits(max_depth=limit))
    except InvalidToolDefinition as exc:
        assert depth > limit, exc.message
        assert f"nested more than {limit} levels" in exc.message
    else:
        assert depth <= limit


@settings(max_examples=200, deadline=None)
@given(payloads)
def test_problem_details_point_at_real_tools_and_are_json(payload: Any) -> None:
    items = payload.get("tools") if isinstance(payload, dict) else payload
    try:
        parse_tools(payload, ToolLimits(max_tools=5))
    except PayloadTooLarge:
        return
    except InvalidToolDefinition as exc:
        json.dumps(exc.details, allow_nan=False)  # the API returns them as they are
        for problem in exc.details:
            assert set(problem) == {"index", "tool", "field", "message"}
            assert problem["message"]
            if problem["index"] is not None:
                assert isinstance(items, list) and 0 <= problem["index"] < len(items)


@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(exclude_categories=["Cs"]), max_size=300), st.integers(64, 1024))
def test_tool_size_limit_counts_compact_utf8_json_bytes(description: str, limit: int) -> None:
    tool = {"name": "t", "description": description}
    size = len(json.dumps(tool, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    try:
        parse_tools([tool], ToolLimits(max_tool_bytes=limit))
    except InvalidToolDefinition as exc:
        assert size > limit and f"is {size} bytes" in exc.message
    else:
        assert size <= limit
