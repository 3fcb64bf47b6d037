"""Tool model and parsers for OpenAI, Anthropic, MCP and plain (BFCL) tool definitions.

A payload is a JSON array of tools, an object ``{"tools": [...]}``, or a whole MCP JSON-RPC
``tools/list`` response ``{"jsonrpc": "2.0", "id": ..., "result": {"tools": [...]}}`` (unwrapped
by :func:`unwrap_jsonrpc`); the format of each tool is detected on its own, so one payload may mix formats. Validation collects every
problem before raising, so a client can fix an upload in one round trip; the limits and the rules
for a name and a description live in :mod:`registry.tool_checks`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from registry.errors import PayloadTooLarge
from registry.name_checks import json_type
from registry.tool_checks import (
    MAX_JSON_DEPTH,
    Problems,
    ToolLimits,
    check_description,
    check_name,
    check_size,
    too_deep,
    tool_label,
)
from registry.tool_text import tool_text

__all__ = [
    "MAX_JSON_DEPTH", "TOOL_FORMATS", "Tool", "ToolFormat", "ToolLimits", "parse_tools", "unwrap_jsonrpc",
]

ToolFormat = Literal["openai", "plain", "anthropic", "mcp"]
TOOL_FORMATS: Final[tuple[str, ...]] = ("openai", "plain", "anthropic", "mcp")
DEFAULT_LIMITS: Final = ToolLimits()


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool of a registry.

    Attributes:
        name: Opaque, non-empty identifier (dots, slashes and Unicode allowed).
        description: What the tool does; ``""`` when the upload had none.
        parameters: JSON schema of the arguments; ``{}`` when none.
        definition: The tool object exactly as uploaded, returned to clients unchanged.
            It shares objects with the parsed payload: treat it as read-only.
        format: Which format the tool was uploaded in.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    definition: dict[str, Any]
    format: ToolFormat
    _text: str = field(init=False, repr=False, compare=False)
    _hash: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text = tool_text(self.name, self.description, self.parameters)
        object.__setattr__(self, "_text", text)
        object.__setattr__(self, "_hash", hashlib.sha256(text.encode("utf-8")).hexdigest())

    def text(self) -> str:
        """Return the text that the dense and lexical indexes see (computed once)."""
        return self._text

    def content_hash(self) -> str:
        """Return the hex SHA-256 of :meth:`text`, the embedding-cache key."""
        return self._hash


def unwrap_jsonrpc(payload: Any) -> Any:
    """The ``result`` of a JSON-RPC 2.0 response holding ``{"tools": [...]}`` (an MCP
    ``tools/list`` answer pasted whole); any other payload unchanged.

    Raises:
        InvalidToolDefinition: The payload is a JSON-RPC error response, or a response whose
            result holds no tools.
    """
    if not isinstance(payload, dict) or "jsonrpc" not in payload or "tools" in payload:
        return payload
    problems = Problems()
    result = payload.get("result")
    if "error" in payload:
        error = payload["error"]
        said = error.get("message") if isinstance(error, dict) else None
        problems.add(
            None, None, "error",
            "payload is a JSON-RPC error response, not a tools/list result"
            + (f" (error: {str(said)[:200]})" if said else ""),
        )
    elif not isinstance(result, dict) or "tools" not in result:
        got = json_type(result) + (' without a "tools" key' if isinstance(result, dict) else "")
        problems.add(
            None, None, "result", f'a JSON-RPC response must hold "result": {{"tools": [...]}}, got {got}'
        )
    problems.raise_if_any()
    return result


def parse_tools(payload: Any, limits: ToolLimits = DEFAULT_LIMITS) -> list[Tool]:
    """Parse and validate an uploaded list of tools.

    Args:
        payload: Decoded JSON: an array of tools, an object whose ``"tools"`` key holds one
            (other keys are ignored), or a JSON-RPC response whose ``result`` is such an
            object. Each tool is in OpenAI, Anthropic, MCP or plain form.
        limits: Size limits.

    Returns:
        The tools in upload order.

    Raises:
        PayloadTooLarge: More than ``limits.max_tools`` tools.
        InvalidToolDefinition: Anything else is wrong; ``details`` lists every problem.
    """
    payload = unwrap_jsonrpc(payload)
    problems = Problems()
    if isinstance(payload, dict) and "tools" in payload:
        items = payload["tools"]
        if not isinstance(items, list):
            problems.add(None, None, "tools", f"must be an array, got {json_type(items)}")
    elif isinstance(payload, list):
        items = payload
    else:
        got = json_type(payload) + (' without a "tools" key' if isinstance(payload, dict) else "")
        problems.add(
            None,
            None,
            "tools",
            f'payload must be an array of tools or an object with a "tools" array, got {got}',
        )
    problems.raise_if_any()

    if len(items) > limits.max_tools:
        raise PayloadTooLarge(
            f"{len(items)} tools exceed the limit of {limits.max_tools} tools per registry",
            {"count": len(items), "limit": limits.max_tools},
        )

    tools: list[Tool] = []
    first_index: dict[str, int] = {}
    for i, item in enumerate(items):
        tool, name = _parse_one(i, item, limits, problems)
        if name is not None:
            # Checked even when the tool has other problems, so one round trip shows them all.
            first = first_index.setdefault(name, i)
            if first != i:
                problems.add(
                    i,
                    tool_label(item, limits),
                    _name_field(item),
                    f"duplicate name {name!r}, first used by tools[{first}]",
                )
                continue
        if tool is not None:
            tools.append(tool)
    problems.raise_if_any()
    return tools


def _name_field(item: dict[str, Any]) -> str:
    return "function.name" if "function" in item else "name"


def _parse_one(
    i: int, item: Any, limits: ToolLimits, problems: Problems
) -> tuple[Tool | None, str | None]:
    """Validate one tool.

    Returns:
        The tool (``None`` if it has problems, which are recorded) and its name if valid.
    """
    if not isinstance(item, dict):
        problems.add(i, None, "", f"must be an object, got {json_type(item)}")
        return None, None
    before = len(problems.items)
    label = tool_label(item, limits)
    if too_deep(item, limits.max_depth):
        # Checked first: deeper JSON breaks recursive encoders (json, pydantic) further on.
        problems.add(
            i, label, "", f"is nested more than {limits.max_depth} levels deep (objects and arrays)"
        )
        return None, None
    check_size(i, label, item, limits, problems)

    detected = _detect_format(i, label, item, problems)
    if detected is None:
        return None, None
    fmt, body, prefix, schema_key = detected

    name = check_name(i, label, body, prefix, limits, problems)
    description = check_description(i, label, body, prefix, limits, problems)
    parameters = body.get(schema_key)
    if parameters is None:
        parameters = {}
    elif not isinstance(parameters, dict):
        problems.add(
            i,
            label,
            prefix + schema_key,
            f"must be a JSON object (a JSON schema), got {json_type(parameters)}",
        )
    if len(problems.items) > before or name is None or description is None:
        return None, name
    return Tool(name, description, parameters, item, fmt), name


def _detect_format(
    i: int, label: str | None, item: dict[str, Any], problems: Problems
) -> tuple[ToolFormat, dict[str, Any], str, str] | None:
    """Find a tool's format, its fields' object, their path prefix and its schema key.

    Returns ``None`` (after recording why) when the fields cannot be found at all.
    """
    kind = item.get("type")
    if "function" in item or kind == "function":
        if "type" in item and kind != "function":
            problems.add(i, label, "type", f'must be "function", got {kind!r}')
        if "function" not in item and "name" in item:
            return "openai", item, "", "parameters"  # flat form of the OpenAI Responses API
        function = item.get("function")
        if not isinstance(function, dict):
            got = "missing" if "function" not in item else json_type(function)
            problems.add(
                i,
                label,
                "function",
                f"must be an object with name, description and parameters, got {got}",
            )
            return None
        return "openai", function, "function.", "parameters"

    fmt: ToolFormat
    if "inputSchema" in item:
        fmt, schema_key = "mcp", "inputSchema"
    elif "input_schema" in item:
        fmt, schema_key = "anthropic", "input_schema"
    else:
        fmt, schema_key = "plain", "parameters"
    # Anthropic client tools may say type "custom"; any other type is not a function tool.
    if "type" in item and not (fmt == "anthropic" and kind == "custom"):
        problems.add(i, label, "type", f'must be "function", got {kind!r}')
    return fmt, item, "", schema_key
