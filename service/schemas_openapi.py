"""The hand-written parts of the OpenAPI document: what validation enforces beyond pydantic.

The tool-upload body (``PUT``/``POST /registries/...``: any tool format the parsers accept,
:data:`TOOLS_BODY_OPENAPI`), the shortlist request's knob rules (:data:`SHORTLIST_KNOB_RULES`;
its fields, "not blank" pattern included, are declared in :mod:`registry.request`), and
:func:`document_settings`, which writes the limits that are settings into a built document.
The request and response models are in :mod:`service.schemas`.
"""

from __future__ import annotations

from typing import Any

from registry.tools import ToolLimits

MAX_TOOL_NAME_CHARS = ToolLimits().max_name_chars

# -- what the validation enforces, said in the OpenAPI schema too (a schema-valid request is
# -- not refused for its shape; registry contents, e.g. unknown tool names, still are) --------

TOOL_NAME_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_TOOL_NAME_CHARS,
    "pattern": "^[^\\u0000-\\u001f\\u007f]*$",  # no control characters (registry.tools)
}
_TOOL_FIELDS: dict[str, Any] = {
    "name": TOOL_NAME_SCHEMA,
    "description": {"type": ["string", "null"]},
}
TOOL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One tool; its name is required (OpenAI tools keep it under 'function').",
    "anyOf": [
        {
            "title": "OpenAI tool",
            "required": ["function"],
            "properties": {
                "type": {"const": "function"},
                "function": {"type": "object", "required": ["name"], "properties": _TOOL_FIELDS},
            },
        },
        {
            "title": "Plain function, Anthropic or MCP tool",
            "required": ["name"],
            "not": {"required": ["function"]},
            "properties": {**_TOOL_FIELDS, "type": {"const": "function"}},
        },
    ],
}
EQUIVALENT_GROUP_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": TOOL_NAME_SCHEMA,
    "minItems": 2,
    "uniqueItems": True,
    "description": "At least two distinct names of tools in the upload.",
}
# The depth knobs exclude each other: k fixes the depth (policy fixed, no depth_bias);
# depth_bias tunes bor only. Said as JSON-schema conditions (registry.serving.shortlist enforces them).
SHORTLIST_KNOB_RULES: list[Any] = [
    {
        "if": {"required": ["k"], "properties": {"k": {"type": "integer"}}},
        "then": {"properties": {"policy": {"enum": ["fixed", None]}, "depth_bias": {"type": "null"}}},
    },
    {
        "if": {"required": ["depth_bias"], "properties": {"depth_bias": {"type": "number"}}},
        "then": {"properties": {"policy": {"enum": ["bor", None]}}},
    },
]

# One request (query) or several (queries), never both (registry.request enforces it).
ONE_OF_QUERY_OR_QUERIES: list[Any] = [{"required": ["query"]}, {"required": ["queries"]}]

EXAMPLE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    },
    {
        "name": "convert_currency",
        "description": "Convert an amount between two currencies.",
        "input_schema": {
            "type": "object",
            "properties": {
                "amount": {"type": "number"},
                "from": {"type": "string"},
                "to": {"type": "string"},
            },
        },
    },
]

TOOLS_BODY_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": (
            "Tool JSON: a bare array or {\"tools\": [...]}. Each tool may be an OpenAI tool "
            "({type: function, function: {name, description, parameters}}), a plain function "
            "({name, description, parameters}), an Anthropic tool (input_schema) or an MCP "
            "tools/list item (inputSchema)."
        ),
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [
                        {"type": "array", "items": TOOL_SCHEMA},
                        {
                            "type": "object",
                            "required": ["tools"],
                            "properties": {
                                "tools": {"type": "array", "items": TOOL_SCHEMA},
                                "equivalents": {
                                    "anyOf": [
                                        {"type": "array", "items": EQUIVALENT_GROUP_SCHEMA},
                                        {"type": "null"},
                                    ],
                                    "description": "Groups of tool names that can do the same job.",
                                },
                            },
                        },
                    ]
                },
                "examples": {
                    "array": {"summary": "Bare array, mixed formats", "value": EXAMPLE_TOOLS},
                    "object": {"summary": "Object form", "value": {"tools": EXAMPLE_TOOLS}},
                },
            }
        },
    }
}


def document_settings(openapi: dict[str, Any], max_query_chars: int) -> dict[str, Any]:
    """Write the limits that are settings into a built OpenAPI document (idempotent)."""
    request = openapi.get("components", {}).get("schemas", {}).get("ShortlistRequest")
    if request is not None:
        properties = request["properties"]
        properties["query"]["anyOf"][0]["maxLength"] = max_query_chars
        properties["queries"]["anyOf"][0]["items"]["maxLength"] = max_query_chars
    return openapi
