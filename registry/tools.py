"""Tool model and parsers for OpenAI, Anthropic, MCP and plain (BFCL) tool definitions.

A payload is a JSON array of tools, an object ``{"tools": [...]}``, or a whole MCP JSON-RPC
``tools/list`` response ``{"jsonrpc": "2.0", "id": ..., "result": {"tools": [...]}}`` (unwrapped
by :func:`unwrap_jsonrpc`); the format of each tool is detected on its own, so one payload may mix formats. Validation collects every
problem before raising, so a client can fix an upload in one round trip.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from registry.errors import InvalidToolDefinition, PayloadTooLarge
from registry.name_checks import json_type, url_name_problem
from registry.tool_text import tool_text

ToolFormat = Literal["openai", "plain", "anthropic", "mcp"]
TOOL_FORMATS: Final[tuple[str, ...]] = ("openai", "plain", "anthropic", "mcp")

MAX_JSON_DEPTH: Final = 64
"""Deepest nesting of objects and arrays in one tool definition (the tool object is level 1)."""

_MESSAGE_PROBLEMS: Final = 10  # problems spelled out in the summary message; details has all
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Characters that change how a name displays without showing themselves: bidirectional
# embeddings, overrides and isolates ("\u202egnp.exe" reads "exe.png"), zero-width spaces and
# joiners, word joiners and invisible operators, the byte-order mark.
_INVISIBLE = re.compile("[\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


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


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """Size limits applied by :func:`parse_tools`."""

    max_tools: int = 50_000
    max_tool_bytes: int = 256 * 1024  # compact JSON size of one definition, UTF-8
    max_description_chars: int = 32_768
    max_name_chars: int = 256
    max_depth: int = MAX_JSON_DEPTH
    url_safe_names: bool = True  # refuse names no URL carries faithfully (url_name_problem)
    visible_names: bool = True  # refuse bidi controls and zero-width characters in names

    def for_stored(self) -> ToolLimits:
        """The limits for a version already in the store: it was checked by the rules of the
        day it was written, and must stay readable (and repairable) under newer ones."""
        return replace(self, url_safe_names=False, visible_names=False)


class _Problems:
    """Accumulates ``InvalidToolDefinition`` details."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, index: int | None, tool: str | None, field_: str, message: str) -> None:
        self.items.append({"index": index, "tool": tool, "field": field_, "message": message})

    def raise_if_any(self) -> None:
        if not self.items:
            return
        n = len(self.items)
        tools = len({p["index"] for p in self.items if p["index"] is not None})
        head = f"{n} problem{'s' if n != 1 else ''}"
        if tools:
            head += f" in {tools} tool{'s' if tools != 1 else ''}"
        shown = "; ".join(
            f"{_path(p['index'], p['field'])}: {p['message']}"
            for p in self.items[:_MESSAGE_PROBLEMS]
        )
        more = f"; ... and {n - _MESSAGE_PROBLEMS} more" if n > _MESSAGE_PROBLEMS else ""
        raise InvalidToolDefinition(f"{head}: {shown}{more}", details=self.items)


def _path(index: int | None, field_: str) -> str:
    if index is None:
        return field_ or "payload"
    return f"tools[{index}]" + (f".{field_}" if field_ else "")


def _label(item: dict[str, Any], limits: ToolLimits) -> str | None:
    """The tool's name for error details, if it has a usable one."""
    function = item.get("function")
    name = function.get("name") if isinstance(function, dict) else item.get("name")
    if not isinstance(name, str) or not name:
        return None
    return name if len(name) <= limits.max_name_chars else name[: limits.max_name_chars] + "…"


def unwrap_jsonrpc(payload: Any) -> Any:
    """The ``result`` of a JSON-RPC 2.0 response holding ``{"tools": [...]}`` (an MCP
    ``tools/list`` answer pasted whole); any other payload unchanged.

    Raises:
        InvalidToolDefinition: The payload is a JSON-RPC error response, or a response whose
            result holds no tools.
    """
    if not isinstance(payload, dict) or "jsonrpc" not in payload or "tools" in payload:
        return payload
    problems = _Problems()
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


def parse_tools(payload: Any, limits: ToolLimits = ToolLimits()) -> list[Tool]:
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
    problems = _Problems()
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
                    _label(item, limits),
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
    i: int, item: Any, limits: ToolLimits, problems: _Problems
) -> tuple[Tool | None, str | None]:
    """Validate one tool.

    Returns:
        The tool (``None`` if it has problems, which are recorded) and its name if valid.
    """
    if not isinstance(item, dict):
        problems.add(i, None, "", f"must be an object, got {json_type(item)}")
        return None, None
    before = len(problems.items)
    label = _label(item, limits)
    if _too_deep(item, limits.max_depth):
        # Checked first: deeper JSON breaks recursive encoders (json, pydantic) further on.
        problems.add(
            i, label, "", f"is nested more than {limits.max_depth} levels deep (objects and arrays)"
        )
        return None, None
    _check_size(i, label, item, limits, problems)

    detected = _detect_format(i, label, item, problems)
    if detected is None:
        return None, None
    fmt, body, prefix, schema_key = detected

    name = _check_name(i, label, body, prefix, limits, problems)
    description = _check_description(i, label, body, prefix, limits, problems)
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
    i: int, label: str | None, item: dict[str, Any], problems: _Problems
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


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests dicts and lists deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _check_size(
    i: int, label: str | None, item: dict[str, Any], limits: ToolLimits, problems: _Problems
) -> None:
    try:
        encoded = json.dumps(item, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        size = len(encoded.encode("utf-8"))
    except UnicodeEncodeError:
        problems.add(i, label, "", "contains invalid Unicode (a lone surrogate)")
        return
    except (TypeError, ValueError, RecursionError):
        problems.add(
            i, label, "", "must contain only JSON values (no NaN, Infinity or other types)"
        )
        return
    if size > limits.max_tool_bytes:
        problems.add(
            i,
            label,
            "",
            f"is {size} bytes as JSON, more than the limit of {limits.max_tool_bytes} bytes",
        )


def _check_name(
    i: int,
    label: str | None,
    body: dict[str, Any],
    prefix: str,
    limits: ToolLimits,
    problems: _Problems,
) -> str | None:
    where = prefix + "name"
    if "name" not in body:
        problems.add(i, label, where, "is required (a non-empty string)")
        return None
    name = body["name"]
    if not isinstance(name, str) or not name:
        got = "an empty string" if name == "" else json_type(name)
        problems.add(i, label, where, f"must be a non-empty string, got {got}")
        return None
    ok = not _too_long(i, label, where, name, limits.max_name_chars, problems)
    bad = _CONTROL.search(name)
    if bad:
        problems.add(
            i,
            label,
            where,
            f"must not contain control characters, found U+{ord(bad.group()):04X} "
            f"at position {bad.start()}",
        )
        ok = False
    hidden = _INVISIBLE.search(name) if ok and limits.visible_names else None
    if hidden:
        char = hidden.group()
        problems.add(
            i,
            label,
            where,
            f"must not contain invisible or bidirectional control characters, found "
            f"U+{ord(char):04X} ({unicodedata.name(char, 'FORMAT CHARACTER')}) at position "
            f"{hidden.start()}: the name would display as something it is not",
        )
        ok = False
    problem = url_name_problem(name) if ok and limits.url_safe_names else None
    if problem is not None:
        problems.add(i, label, where, problem)
        ok = False
    return name if ok else None


def _check_description(
    i: int,
    label: str | None,
    body: dict[str, Any],
    prefix: str,
    limits: ToolLimits,
    problems: _Problems,
) -> str | None:
    where = prefix + "description"
    description = body.get("description")
    if description is None:
        return ""
    if not isinstance(description, str):
        problems.add(i, label, where, f"must be a string, got {json_type(description)}")
        return None
    if _too_long(i, label, where, description, limits.max_description_chars, problems):
        return None
    return description


def _too_long(i: int, label: str | None, where: str, text: str, limit: int, problems: _Problems) -> bool:
    """Record a problem when ``text`` exceeds ``limit`` characters; True if it does."""
    if len(text) <= limit:
        return False
    problems.add(i, label, where, f"must be at most {limit} characters, got {len(text)}")
    return True
