"""Name checks: registry names (safe as one path segment, file name or key), tool names that survive a
URL path, and the JSON type names that validation errors quote."""

from __future__ import annotations

import re
from typing import Any, Final

from registry.errors import InvalidRegistryName

MAX_REGISTRY_NAME_CHARS: Final = 128
REGISTRY_NAME_PATTERN: Final = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"
"""Registry names as a JSON-schema pattern: safe as one path segment, a file name or a key."""

_REGISTRY_NAME = re.compile(r"[A-Za-z0-9._-]+")
_REGISTRY_BAD_CHAR = re.compile(r"[^A-Za-z0-9._-]")
_PATH_SEPARATORS = re.compile(r"[/\\]")  # WHATWG reads a backslash as '/' in http(s) URLs
_ENCODED_DOT = re.compile(r"%2e", re.IGNORECASE)  # WHATWG reads '%2e' as '.' in a dot segment

__all__ = ["MAX_REGISTRY_NAME_CHARS", "REGISTRY_NAME_PATTERN", "json_type", "url_name_problem", "validate_registry_name"]


def json_type(value: Any) -> str:
    """The JSON name of ``value``'s type (``null``, ``number``, ...), for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def url_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be carried faithfully in a URL path, or ``None`` when it can.

    Browsers, HTTP clients and proxies resolve ``.`` and ``..`` segments (``%2e`` spelt out,
    ``\\`` read as ``/``) and some merge ``//``: a tool called ``../../victim`` put in a path
    addresses registry ``victim``. Such names are refused at upload; the API takes tool names
    out of the path anyway (``DELETE /registries/{r}/tools?name=``).
    """
    segments = _PATH_SEPARATORS.split(name)
    for segment in segments:
        if _ENCODED_DOT.sub(".", segment) in (".", ".."):
            return (
                f"must not have a '.' or '..' path segment, got {name!r}: URLs resolve it "
                "and would address another resource"
            )
    if len(segments) > 1 and "" in segments:
        return (
            f"must not have an empty path segment (a leading, trailing or doubled '/'), "
            f"got {name!r}: proxies merge or drop it"
        )
    return None


def validate_registry_name(name: str) -> str:
    """Check a registry name: 1-128 of ``A-Z a-z 0-9 . _ -``, not starting with ``.``.

    The rule (:data:`REGISTRY_NAME_PATTERN`) makes a name safe as a single path segment: no
    separators, no ``.``/``..``, no hidden names (stores keep their own files under dot names).

    Args:
        name: The proposed name.

    Returns:
        The name, unchanged.

    Raises:
        InvalidRegistryName: The name breaks a rule; the message says which.
    """
    problem: str | None = None
    if not isinstance(name, str):
        problem = f"registry name must be a string, got {json_type(name)}"
    elif not name:
        problem = "registry name must not be empty"
    elif len(name) > MAX_REGISTRY_NAME_CHARS:
        problem = (
            f"registry name must be at most {MAX_REGISTRY_NAME_CHARS} characters, got {len(name)}"
        )
    elif not _REGISTRY_NAME.fullmatch(name):
        bad = _REGISTRY_BAD_CHAR.search(name)
        char = bad.group() if bad else "?"
        problem = (
            f"registry name {name!r} contains {char!r}: "
            "only letters A-Z a-z, digits, '.', '_' and '-' are allowed"
        )
    elif name in (".", ".."):
        problem = f"registry name {name!r} is reserved"
    elif name.startswith("."):
        problem = f"registry name {name!r} must not start with '.'"
    if problem is not None:
        raise InvalidRegistryName(problem, [{"field": "registry", "message": problem}])
    return name
