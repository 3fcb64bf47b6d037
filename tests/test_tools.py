"""Unit and property tests for registry.tools: formats, validation, limits (registry names:
tests/test_names.py; the index text: tests/test_tool_text.py)."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.errors import InvalidRegistryName, InvalidToolDefinition, PayloadTooLarge
from registry.names import REGISTRY_NAME_PATTERN, url_name_problem, validate_registry_name
from registry.tool_text import tool_text
from registry.tools import MAX_JSON_DEPTH, Tool, ToolLimits, parse_tools

FIXTURES = Path(__file__).parent / "fixtures"

SCHEMA = {"type": "object", "properties": {"q": {"type": "string", "description": "Query."}}}


def openai(name: Any, **function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **function}}


DEFAULT_LIMITS = ToolLimits()


def problems(payload: Any, limits: ToolLimits = DEFAULT_LIMITS) -> list[dict[str, Any]]:
    """The details of the InvalidToolDefinition that parsing ``payload`` raises."""
    with pytest.raises(InvalidToolDefinition) as info:
        parse_tools(payload, limits)
    details = info.value.details
    assert isinstance(details, list) and details
    return details


def one_problem(payload: Any, limits: ToolLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    details = problems(payload, limits)
    assert len(details) == 1, details
    return details[0]


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
@given(st.text(max_size=140) | st.text(alphabet="ab._-/\\\u2024\uff0e", max_size=8))
def test_registry_names_are_accepted_exactly_as_the_documented_pattern_says(name: str) -> None:
    # The OpenAPI schema publishes REGISTRY_NAME_PATTERN; the validator must agree with it.
    documented = re.fullmatch(REGISTRY_NAME_PATTERN, name) is not None
    try:
        validate_registry_name(name)
    except InvalidRegistryName as exc:
        assert not documented, name
        assert exc.details == [{"field": "registry", "message": exc.message}]
    else:
        assert documented, name
        assert "/" not in name and "\\" not in name and not name.startswith(".")


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
