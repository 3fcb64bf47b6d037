"""The text that represents a tool in the dense and lexical indexes (one function, used
everywhere a tool is embedded or indexed: serving, training, benchmarks)."""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Final

MAX_TEXT_CHARS: Final = 8_000
"""Cap on the index text of one tool (the embedder truncates far earlier anyway)."""

_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SEPARATORS = re.compile(r"[\W_]+")

__all__ = ["MAX_TEXT_CHARS", "split_identifier", "tool_text"]


def _char_class(c: str) -> str:
    if c.isdigit():
        return "D"
    if c.isupper():
        return "U"
    if c.islower():
        return "L"
    if c.isalpha():
        return "O"  # caseless letter (CJK, ...)
    return "M"  # combining marks and the like stay with their neighbours


def split_identifier(name: str) -> list[str]:
    """Split an identifier into lowercase words.

    Splits on every non-alphanumeric character (``_ . / -`` ...), at lower-to-upper case
    changes, before the last capital of an acronym (``HTTPResponse`` -> ``http response``)
    and between digits and non-digits.

    Args:
        name: An identifier in snake_case, camelCase, dotted, slashed or dashed form.

    Returns:
        The words, lowercased; ``[]`` when the name has no letters or digits.
    """
    words: list[str] = []
    for chunk in _SEPARATORS.split(unicodedata.normalize("NFC", name)):
        if not chunk:
            continue
        classes = [_char_class(c) for c in chunk]
        start = 0
        for j in range(1, len(chunk)):
            prev, cur = classes[j - 1], classes[j]
            boundary = (
                ((cur == "D") != (prev == "D"))
                or (cur == "U" and prev == "L")
                or ((cur == "O") != (prev == "O") and "M" not in (cur, prev))
                or (cur == "U" and prev == "U" and j + 1 < len(chunk) and classes[j + 1] == "L")
            )
            if boundary:
                words.append(chunk[start:j].lower())
                start = j
        words.append(chunk[start:].lower())
    return words


def _squash(text: str) -> str:
    return " ".join(text.split())


def tool_text(name: str, description: str, parameters: Any) -> str:
    """Build the text that represents a tool in the dense and lexical indexes.

    Lines: the name; its words (:func:`split_identifier`) unless identical to the name; the
    description; then ``Parameters: a: desc; b`` over the top-level ``properties`` of the
    schema, in order, each named by its words. Whitespace is collapsed, lone surrogates
    become U+FFFD, and the result is capped at :data:`MAX_TEXT_CHARS`. Odd schemas are
    tolerated: anything that is not a dict is ignored.

    Args:
        name: Tool name.
        description: Tool description.
        parameters: JSON schema of the arguments.

    Returns:
        The index text, deterministic for the same inputs.
    """
    lines = [name]
    words = " ".join(split_identifier(name))
    if words and words != name:
        lines.append(words)
    if isinstance(description, str) and description.strip():
        lines.append(_squash(description))

    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if isinstance(properties, dict) and properties:
        parts: list[str] = []
        size = sum(len(line) + 1 for line in lines)
        for key, spec in properties.items():
            key = str(key)
            label = " ".join(split_identifier(key)) or key
            desc = spec.get("description") if isinstance(spec, dict) else None
            part = f"{label}: {_squash(desc)}" if isinstance(desc, str) and desc.strip() else label
            parts.append(part)
            size += len(part) + 2
            if size > MAX_TEXT_CHARS:
                break
        lines.append("Parameters: " + "; ".join(parts))

    text = "\n".join(lines)[:MAX_TEXT_CHARS]
    return _SURROGATE.sub("\ufffd", text)
