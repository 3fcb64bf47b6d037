"""Reading the four accepted tool shapes (OpenAI, plain, Anthropic, MCP) the same way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolSpec:
    """A tool's name, description and JSON-schema parameters, whatever shape it came in."""

    name: str
    description: str
    parameters: dict[str, Any]


def tool_spec(definition: Mapping[str, Any]) -> ToolSpec:
    """Read an OpenAI (``{"type": "function", "function": {...}}``), plain (``parameters``),
    Anthropic (``input_schema``) or MCP (``inputSchema``) tool definition."""
    inner = definition.get("function")
    body: Mapping[str, Any] = inner if isinstance(inner, Mapping) else definition
    schema = next(
        (body[key] for key in ("parameters", "input_schema", "inputSchema") if body.get(key)),
        EMPTY_SCHEMA,
    )
    return ToolSpec(
        name=str(body["name"]),
        description=str(body.get("description") or ""),
        parameters=dict(schema),
    )


def query_of(arguments: object) -> str:
    """The search text from a model's tool-search arguments (a dict or its JSON text)."""
    import json

    if isinstance(arguments, str):
        text = arguments
        try:
            arguments = json.loads(text)
        except ValueError:
            return text
    if isinstance(arguments, Mapping):
        for key in ("query", "q", "goal", "search"):
            if isinstance(arguments.get(key), str):
                return str(arguments[key])
        texts = [str(v) for v in arguments.values() if isinstance(v, str)]
        if texts:
            return " ".join(texts)
    raise ValueError(f"no search query in tool search arguments: {arguments!r}")


QUERY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "What the tool should do, in plain words (the user's request or the "
            "current step).",
        }
    },
    "required": ["query"],
}
SEARCH_DESCRIPTION = (
    "Search the tool catalogue for tools that can do what you need next. Describe the task in "
    "plain words; the matching tools are loaded and can be called right after."
)
