"""Tools named verbatim in a request ("run get_ticker_info for AAPL").

A user or agent who names a tool wants that tool; missing it is the worst kind of miss. A
:class:`NameIndex` is built once per registry version and finds, in microseconds, the tools a
request names:

* a name that looks like an identifier (``get_ticker_info``, ``slack-post``,
  ``math.factorial``, ``createIssue``, ``v2``...: it holds ``_``, ``-``, ``.``, ``/``, ``:``,
  a digit or an inner capital) matches wherever it appears as a whole token, in any case;
* so does the last dotted/slashed segment of a name when that segment is itself
  identifier-like (``get_ticker_info`` names ``yahoo.get_ticker_info``);
* a plain-word name (``search``, ``timeport``) matches only in quotes or backticks
  (```search```, ``"search"``): as a bare word it is ordinary language.

A segment shared by several tools names all of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["NameIndex", "identifier_like"]

_SEPARATORS = re.compile(r"[./:]")
# Candidate identifiers in free text: runs of word characters joined by . - / : (no spaces).
_TOKEN = re.compile(r"[A-Za-z0-9_](?:[\w.\-/:]*\w)?")
_QUOTED = re.compile(r"`([^`\n]{1,200})`|\"([^\"\n]{1,200})\"|'([^'\n]{1,200})'")
_INNER_CAPITAL = re.compile(r"[a-z][A-Z]")
_MAX_NAMED = 64  # a request naming more tools than this is a pasted list, not a request


def identifier_like(name: str) -> bool:
    """True for names that do not read as an ordinary word."""
    return (
        any(c in name for c in "_-./:")
        or any(c.isdigit() for c in name)
        or _INNER_CAPITAL.search(name) is not None
    )


def _segment(name: str) -> str:
    return _SEPARATORS.split(name)[-1]


class NameIndex:
    """Lower-cased names (and identifier-like last segments) of one registry's tools."""

    __slots__ = ("_bare", "_quoted")

    def __init__(self, names: Iterable[str]) -> None:
        self._bare: dict[str, list[int]] = {}  # matched as a bare token
        self._quoted: dict[str, list[int]] = {}  # matched only in quotes/backticks
        for position, name in enumerate(names):
            self._add(position, name, copied=None)

    def _add(self, position: int, name: str, copied: set[int] | None) -> None:
        keys = {name}
        segment = _segment(name)
        if segment and segment != name and identifier_like(segment):
            keys.add(segment)
        for key in keys:
            table = self._bare if identifier_like(key) else self._quoted
            lowered = key.lower()
            found = table.get(lowered)
            if found is None:
                table[lowered] = [position]
            else:
                if copied is not None and id(found) not in copied:  # shared with the original
                    found = table[lowered] = list(found)
                    copied.add(id(found))
                found.append(position)

    def extended(self, names: Iterable[str], start: int) -> NameIndex:
        """This index plus ``names`` at positions ``start``, ``start + 1``, ... (a registry's
        appended tools); ``self`` is left unchanged and shares the untouched entries."""
        out = NameIndex(())
        out._bare, out._quoted = dict(self._bare), dict(self._quoted)
        copied: set[int] = set()
        for position, name in enumerate(names, start=start):
            out._add(position, name, copied)
        return out

    def __len__(self) -> int:
        return len(self._bare) + len(self._quoted)

    def find(self, text: str) -> list[int]:
        """Positions of the tools ``text`` names, in the order they are first named.

        One C-level tokenisation and a set intersection with the known names: a 280k-character
        message costs a few milliseconds (a per-token Python loop cost ~40 ms).
        """
        if not self._bare and not self._quoted:
            return []
        lowered = text.lower()
        first: dict[str, int] = {}  # named key -> where it is first named
        for key in self._bare.keys() & set(_TOKEN.findall(lowered)):
            first[key] = lowered.find(key)
        for match in _QUOTED.finditer(lowered):
            inner = next(g for g in match.groups() if g is not None).strip()
            if inner in self._quoted or inner in self._bare:
                first.setdefault(inner, match.start())
        found: dict[int, None] = {}
        for key in sorted(first, key=first.__getitem__):
            for table in (self._bare, self._quoted):
                found.update(dict.fromkeys(table.get(key, ())))
        return list(found) if len(found) <= _MAX_NAMED else []
