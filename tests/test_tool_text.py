"""registry.tool_text: identifier words and the index text of a tool."""

from __future__ import annotations

from typing import Any

import pytest

from registry.tool_text import MAX_TEXT_CHARS, split_identifier, tool_text


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("getWeatherForecast", ["get", "weather", "forecast"]),
        ("math.factorial", ["math", "factorial"]),
        ("get_HTTPResponse2", ["get", "http", "response", "2"]),
        ("snake_case_name", ["snake", "case", "name"]),
        ("GetUser", ["get", "user"]),
        ("github/create_issue", ["github", "create", "issue"]),
        ("kebab-case--name", ["kebab", "case", "name"]),
        ("v2api", ["v", "2", "api"]),
        ("sha256Sum", ["sha", "256", "sum"]),
        ("ALLCAPS", ["allcaps"]),
        ("XMLHttpRequest", ["xml", "http", "request"]),
        ("météoPrévision", ["météo", "prévision"]),
        ("天气Forecast", ["天气", "forecast"]),
        ("__init__", ["init"]),
        ("a", ["a"]),
        ("", []),
        ("._/-", []),
    ],
)
def test_split_identifier(name: str, words: list[str]) -> None:
    assert split_identifier(name) == words


def test_tool_text_example() -> None:
    params = {
        "type": "dict",
        "properties": {
            "number": {
                "type": "integer",
                "description": "The number for which factorial needs to be calculated.",
            }
        },
    }
    text = tool_text("math.factorial", "Calculate the factorial of a given number.", params)
    assert text == (
        "math.factorial\nmath factorial\nCalculate the factorial of a given number.\n"
        "Parameters: number: The number for which factorial needs to be calculated."
    )


def test_tool_text_skips_identical_words_and_empty_parts() -> None:
    assert tool_text("search", "", {}) == "search"
    assert tool_text("search", "  ", {"properties": {}}) == "search"


def test_tool_text_parameters_in_order() -> None:
    params = {
        "properties": {
            "cityName": {"description": "City,\n  e.g.   Paris."},
            "max_days": {"type": "integer"},
            "_": {"description": "odd"},
        }
    }
    text = tool_text("getWeather", "Weather.", params)
    assert text.splitlines() == [
        "getWeather",
        "get weather",
        "Weather.",
        "Parameters: city name: City, e.g. Paris.; max days; _: odd",
    ]


@pytest.mark.parametrize(
    "params",
    [
        None,
        [],
        "schema",
        {"properties": []},
        {"properties": "x"},
        {"properties": {"a": "not a dict", "b": {"description": 5}, "c": None, 3: {}}},
    ],
)
def test_tool_text_tolerates_odd_schemas(params: Any) -> None:
    text = tool_text("f", "d", params)
    assert text.startswith("f\nd")


def test_tool_text_capped() -> None:
    params = {"properties": {f"p{i}": {"description": "x" * 500} for i in range(100)}}
    text = tool_text("f", "y" * 20_000, params)
    assert len(text) == MAX_TEXT_CHARS
    assert text == tool_text("f", "y" * 20_000, params)
