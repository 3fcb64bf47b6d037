"""What one tool definition may hold: the size limits, the rules for its name and description,
and the problems list that gathers every breach before one error is raised (so a client fixes an
upload in one round trip). The formats and where each keeps its fields: :mod:`registry.tools`."""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, replace
from typing import Any, Final

from registry.errors import InvalidToolDefinition
from registry.name_checks import json_type, url_name_problem

__all__ = [
    "MAX_JSON_DEPTH", "Problems", "ToolLimits", "check_description", "check_name", "check_size",
    "too_deep", "tool_label",
]

MAX_JSON_DEPTH: Final = 64
"""Deepest nesting of objects and arrays in one tool definition (the tool object is level 1)."""

_MESSAGE_PROBLEMS: Final = 10  # problems spelled out in the summary message; details has all
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Characters that change how a name displays without showing themselves: bidirectional
# embeddings, overrides and isolates ("\u202egnp.exe" reads "exe.png"), zero-width spaces and
# joiners, word joiners and invisible operators, the byte-order mark.
_INVISIBLE = re.compile("[\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """Size limits applied by :func:`registry.tools.parse_tools`."""

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


class Problems:
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
            f"{problem_path(p['index'], p['field'])}: {p['message']}"
            for p in self.items[:_MESSAGE_PROBLEMS]
        )
        more = f"; ... and {n - _MESSAGE_PROBLEMS} more" if n > _MESSAGE_PROBLEMS else ""
        raise InvalidToolDefinition(f"{head}: {shown}{more}", details=self.items)


def problem_path(index: int | None, field_: str) -> str:
    if index is None:
        return field_ or "payload"
    return f"tools[{index}]" + (f".{field_}" if field_ else "")


def tool_label(item: dict[str, Any], limits: ToolLimits) -> str | None:
    """The tool's name for error details, if it has a usable one."""
    function = item.get("function")
    name = function.get("name") if isinstance(function, dict) else item.get("name")
    if not isinstance(name, str) or not name:
        return None
    return name if len(name) <= limits.max_name_chars else name[: limits.max_name_chars] + "…"


def too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests dicts and lists deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def check_size(
    i: int, label: str | None, item: dict[str, Any], limits: ToolLimits, problems: Problems
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


def check_name(
    i: int,
    label: str | None,
    body: dict[str, Any],
    prefix: str,
    limits: ToolLimits,
    problems: Problems,
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
    ok = not too_long(i, label, where, name, limits.max_name_chars, problems)
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


def check_description(
    i: int,
    label: str | None,
    body: dict[str, Any],
    prefix: str,
    limits: ToolLimits,
    problems: Problems,
) -> str | None:
    where = prefix + "description"
    description = body.get("description")
    if description is None:
        return ""
    if not isinstance(description, str):
        problems.add(i, label, where, f"must be a string, got {json_type(description)}")
        return None
    if too_long(i, label, where, description, limits.max_description_chars, problems):
        return None
    return description


def too_long(i: int, label: str | None, where: str, text: str, limit: int, problems: Problems) -> bool:
    """Record a problem when ``text`` exceeds ``limit`` characters; True if it does."""
    if len(text) <= limit:
        return False
    problems.add(i, label, where, f"must be at most {limit} characters, got {len(text)}")
    return True
