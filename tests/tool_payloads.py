"""Tool payloads and the problems parsing them reports, shared by the registry.tools tests."""

from __future__ import annotations

from typing import Any

import pytest

from registry.errors import InvalidToolDefinition
from registry.tools import ToolLimits, parse_tools

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
