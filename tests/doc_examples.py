"""Reading the curl examples of a Markdown document and the answers it documents for them.

A ```bash block's ``curl`` commands are the examples (other lines, such as ``npx`` or ``docker``,
are not run; ``NAME=value`` lines are shell variables the commands may use). What a command
should answer is documented, in order of precedence, by:

- a trailing ``# -> <answer>`` or ``# <answer>`` comment on its last line, or a ``# -> <answer>``
  line right after it, where ``<answer>`` is a status code (``204``) or a JSON shape;
- a ```json block right after the ```bash block, for the block's last command.

A command with no documented status must answer 2xx. JSON shapes are JSON with elisions:
``{...}`` any object, ``[...]`` any list, ``"..."`` any string, ``...`` as an array item "more
items here", ``...`` as an object member "other keys too", and a bare ``"key"`` member "this key,
any value". Without ``...`` an object's keys must be exactly the documented ones and an array's
items exactly the documented items; text after the shape is prose.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLIENT_DOC = Path(__file__).resolve().parent.parent / "docs" / "client.md"


def client_doc_block(name: str) -> str:
    """docs/client.md's ```python block between ``<!-- name -->`` and ``<!-- /name -->``."""
    text = CLIENT_DOC.read_text()
    found = re.search(rf"<!-- {name} -->\n```python\n(.*?)```\n<!-- /{name} -->", text, re.S)
    assert found, f"docs/client.md has no {name} block"
    return found.group(1)


ANY = object()
"""Matches any value (``{...}``, ``[...]``, a bare key's value)."""
ANY_STRING = object()
"""``"..."``: any string."""
MORE = object()
"""``...`` in an array: any number of further items."""


@dataclass
class Shape:
    """A documented object: its keys' shapes; ``open`` when ``...`` allows other keys."""

    keys: dict[str, Any]
    open: bool = False


@dataclass
class Example:
    """One curl command, the shell variables before it, and what it should answer."""

    line: int
    argv: list[str]
    variables: dict[str, str]
    status: int | None = None
    shape: Any = None
    documented: str = ""
    raw: str = field(default="", repr=False)


# -- the elided-JSON shapes ------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.decoder = json.JSONDecoder()

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self, token: str) -> bool:
        self.skip()
        return self.text.startswith(token, self.pos)

    def take(self, token: str) -> None:
        if not self.peek(token):
            raise ValueError(f"expected {token!r} at {self.text[self.pos : self.pos + 40]!r}")
        self.pos += len(token)

    def value(self) -> Any:
        if self.peek("{"):
            return self.obj()
        if self.peek("["):
            return self.array()
        found, end = self.decoder.raw_decode(self.text, self.pos)
        self.pos = end
        return ANY_STRING if found == "..." else found

    def obj(self) -> Any:
        self.take("{")
        if self.peek("...}"):
            self.take("...}")
            return ANY
        shape = Shape({})
        while not self.peek("}"):
            if self.peek("..."):
                self.take("...")
                shape.open = True
            else:
                key, self.pos = self.decoder.raw_decode(self.text, self.pos)
                if self.peek(":"):
                    self.take(":")
                    shape.keys[key] = self.value()
                else:
                    shape.keys[key] = ANY
            if not self.peek("}"):
                self.take(",")
        self.take("}")
        return shape

    def array(self) -> Any:
        self.take("[")
        if self.peek("...]"):
            self.take("...]")
            return ANY
        items: list[Any] = []
        while not self.peek("]"):
            if self.peek("..."):
                self.take("...")
                items.append(MORE)
            else:
                items.append(self.value())
            if not self.peek("]"):
                self.take(",")
        self.take("]")
        return items


def parse_shape(text: str) -> Any:
    """The shape documented at the start of ``text`` (the prose after it is ignored)."""
    return _Parser(text).value()


# -- matching an answer against its shape ----------------------------------------------------------

VOLATILE: dict[str, type | tuple[type, ...]] = {
    "shortlist_id": str,
    "job": str,
    "written_at": (int, float),
}
"""Keys whose documented value is an example of its type (an id, a time), not a promise."""
SCORE_TOLERANCE = 0.01
"""Ranking scores move in the last digits with the ONNX Runtime build; a real change moves more."""


@dataclass
class Match:
    """What :func:`match` found: every mismatch (path, why), and the documented values of
    volatile keys with the served ones, for the commands after."""

    problems: list[str] = field(default_factory=list)
    seen: dict[str, str] = field(default_factory=dict)


def match(shape: Any, actual: Any, path: str = "$", out: Match | None = None) -> Match:
    out = out if out is not None else Match()
    key = path.rsplit(".", 1)[-1]
    if shape is ANY:
        return out
    if shape is ANY_STRING:
        if not isinstance(actual, str):
            out.problems.append(f"{path}: a string was documented, got {actual!r}")
        return out
    if isinstance(shape, Shape):
        if not isinstance(actual, dict):
            out.problems.append(f"{path}: an object was documented, got {type(actual).__name__}")
            return out
        missing = [k for k in shape.keys if k not in actual]
        extra = [] if shape.open else [k for k in actual if k not in shape.keys]
        if missing or extra:
            out.problems.append(f"{path}: keys missing {missing}, undocumented {extra}")
        for k, sub in shape.keys.items():
            if k in actual:
                match(sub, actual[k], f"{path}.{k}", out)
        return out
    if isinstance(shape, list):
        _match_items(shape, actual, path, out)
        return out
    if key in VOLATILE:
        if not isinstance(actual, VOLATILE[key]) or isinstance(actual, bool):
            out.problems.append(f"{path}: documented {shape!r}, got {actual!r}")
        elif isinstance(shape, str) and isinstance(actual, str):
            out.seen[shape] = actual
        return out
    if _same(shape, actual, key):
        return out
    out.problems.append(f"{path}: documented {shape!r}, got {actual!r}")
    return out


def _same(shape: Any, actual: Any, key: str) -> bool:
    if isinstance(shape, bool) or isinstance(actual, bool) or shape is None or actual is None:
        return shape is actual or (shape == actual and type(shape) is type(actual))
    if isinstance(shape, (int, float)) and isinstance(actual, (int, float)):
        if key == "score":
            return abs(shape - actual) <= SCORE_TOLERANCE
        return math.isclose(shape, actual, rel_tol=1e-9, abs_tol=1e-12)
    return bool(shape == actual)


def _match_items(shape: list[Any], actual: Any, path: str, out: Match) -> None:
    if not isinstance(actual, list):
        out.problems.append(f"{path}: an array was documented, got {type(actual).__name__}")
        return
    items = [s for s in shape if s is not MORE]
    if MORE not in shape:
        if len(items) != len(actual):
            out.problems.append(f"{path}: {len(items)} items documented, got {len(actual)}")
            return
        for i, (sub, value) in enumerate(zip(items, actual, strict=True)):
            match(sub, value, f"{path}[{i}]", out)
        return
    # With elisions: the documented items appear in order; without a leading (trailing) `...`
    # the first (last) one is the first (last) item.
    start, end = shape[0] is not MORE, shape[-1] is not MORE
    at = 0
    positions: list[int] = []
    for sub in items:
        while at < len(actual) and match(sub, actual[at], path).problems:
            at += 1
        if at == len(actual):
            out.problems.append(f"{path}: no item matches {_describe(sub)} (in order)")
            return
        positions.append(at)
        match(sub, actual[at], f"{path}[{at}]", out)
        at += 1
    if positions and start and positions[0] != 0:
        out.problems.append(f"{path}: the first documented item is not the first item")
    if positions and end and positions[-1] != len(actual) - 1:
        out.problems.append(f"{path}: the last documented item is not the last item")


def _describe(shape: Any) -> str:
    if isinstance(shape, Shape):
        return "{" + ", ".join(f"{k}={v!r}" for k, v in list(shape.keys.items())[:2]) + ", ...}"
    return repr(shape)


# -- reading the examples out of Markdown ----------------------------------------------------------

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
_STATUS = re.compile(r"^(?:->\s*)?(\d{3})\b")
_VARIABLE = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$")


def _documented(comment: str) -> tuple[int | None, Any]:
    """(status, shape) of a ``# ...`` comment's text, or (None, None) for prose."""
    text = comment.strip()
    if text.startswith("->"):
        text = text[2:].strip()
    elif not text.startswith("{"):
        status = _STATUS.match(text)
        return (int(status.group(1)), None) if status else (None, None)
    status = _STATUS.match(text)
    if status:
        return int(status.group(1)), None
    return None, parse_shape(text)


def _split_comment(command: str) -> tuple[str, str | None]:
    """The command without its trailing ``#`` comment, and the comment (outside quotes)."""
    quote: str | None = None
    for i, char in enumerate(command):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i], command[i + 1 :].strip()
    return command, None


def examples(markdown: str) -> list[Example]:
    """Every curl example of ``markdown``, in document order, with its documented answer."""
    found: list[Example] = []
    fences = list(_FENCE.finditer(markdown))
    for index, fence in enumerate(fences):
        if fence.group(1) != "bash":
            continue
        first_line = markdown.count("\n", 0, fence.start(2)) + 1
        block = _block_examples(fence.group(2), first_line)
        after = fences[index + 1] if index + 1 < len(fences) else None
        if (
            block
            and after
            and after.group(1) == "json"
            and not markdown[fence.end() : after.start()].strip()
        ):
            block[-1].shape = parse_shape(after.group(2))
            block[-1].documented = after.group(2).strip()
        found.extend(block)
    return found


def _block_examples(body: str, first_line: int) -> list[Example]:
    lines = body.splitlines()
    variables: dict[str, str] = {}
    out: list[Example] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        start = i
        i += 1
        if line.startswith("# ->") and out:
            result = line[1:]
            while _open_shape(result) and i < len(lines) and lines[i].lstrip().startswith("#"):
                result += " " + lines[i].lstrip()[1:].strip()  # a shape continued on `#` lines
                i += 1
            out[-1].status, out[-1].shape = _documented(result)
            out[-1].documented = result.strip()
            continue
        if not line or line.startswith("#"):
            continue
        text = lines[start]
        while _unfinished(text) and i < len(lines):
            text += "\n" + lines[i]
            i += 1
        command, comment = _split_comment(text.replace("\\\n", " "))
        variable = _VARIABLE.match(command.strip())
        if variable:
            variables[variable.group(1)] = shlex.split(variable.group(2))[0]
            continue
        argv = shlex.split(command)
        if not argv or argv[0] != "curl":
            continue
        example = Example(start + first_line, argv, dict(variables), raw=text)
        if comment:
            example.status, example.shape = _documented(comment)
            example.documented = comment
        out.append(example)
    return out


def _open_shape(comment: str) -> bool:
    """Is the shape in ``comment`` cut short (so it goes on in the next comment line)?"""
    try:
        _documented(comment)
    except ValueError:  # json.JSONDecodeError included
        return True
    return False


def _unfinished(text: str) -> bool:
    """Does the shell text continue on the next line (a trailing backslash or an open quote)?"""
    if text.endswith("\\"):
        return True
    try:
        shlex.split(_split_comment(text)[0])
    except ValueError:
        return True
    return False
