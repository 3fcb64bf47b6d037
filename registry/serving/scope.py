"""Which of a registry's tools a request may see: ``allowed_tools`` and a token's bound patterns.

A scoped request is ranked, cut and capped over its allowed tools alone, never filtered after
the cap: a shortlist must not spend its slots on tools the caller may not use (the failure
agent frameworks report when a policy filter runs after ``top_k``). So the scope is resolved
to tool positions *before* ranking (:func:`allowed_ids`), and the query path ranks only those
(:func:`registry.index.hybrid.rank_within`); every later step (named tools, usage lifts,
near-duplicate folding, coverage) works on that ranking, and :func:`allows` is the last
guard before a list is shown.

Patterns follow :func:`fnmatch.fnmatchcase`: ``*`` any run of characters (``/`` included),
``?`` one character, ``[abc]`` one of a set; an entry without these is a tool's exact name.
Matching is case-sensitive, as tool names are.

The effective set is the intersection: the token's patterns (an admin's binding, see
``SHORTLIST_QUERY_TOKEN_SCOPES``) say what the caller may ever see; ``allowed_tools`` can only
narrow it. A request pattern that matches none of the tools the caller may see is refused
(422 naming it), the same whether the tool is absent or outside the token's scope, so a
scoped token learns nothing of the tools it cannot see.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from fnmatch import translate

import numpy as np

from registry.errors import ScopeForbidden, ValidationFailed
from registry.index.snapshot import Snapshot

__all__ = ["GLOB_CHARS", "ScopeCache", "allowed_ids", "allows"]

GLOB_CHARS = frozenset("*?[")
_CACHED_SCOPES = 256  # (registry version, patterns) -> ids kept; an agent resends the same list
_MAX_NAMED_PROBLEMS = 20  # unmatched patterns named in the error message


def _hits(snap: Snapshot, patterns: Iterable[str]) -> list[list[int]]:
    """Per pattern, the positions of the tools it matches."""
    by_name = snap.by_name
    names: list[str] | None = None
    hits: list[list[int]] = []
    for pattern in patterns:
        if GLOB_CHARS.isdisjoint(pattern):
            position = by_name.get(pattern)
            hits.append([position] if position is not None else [])
        else:
            if names is None:
                names = list(by_name)
            match = re.compile(translate(pattern)).match  # fnmatchcase, on every platform
            hits.append([by_name[name] for name in names if match(name)])
    return hits


def _sorted_ids(positions: set[int]) -> np.ndarray:
    return np.fromiter(sorted(positions), np.int64, len(positions))


def allowed_ids(
    snap: Snapshot, allowed: Sequence[str] | None, bound: Sequence[str] | None
) -> np.ndarray:
    """Positions (ascending) of the tools a request may see on ``snap``.

    Args:
        snap: The registry version being queried.
        allowed: The request's ``allowed_tools`` (None: every tool the token may see).
        bound: The patterns bound to the caller's token (None: an unbound token).

    Raises:
        ScopeForbidden: the token's patterns match no tool of this registry.
        ValidationFailed: naming each of ``allowed`` that matches none of the tools the caller
            may see.
    """
    visible: set[int] | None = None
    if bound is not None:
        visible = {t for hits in _hits(snap, bound) for t in hits}
        if not visible:
            raise ScopeForbidden(
                f"this token may use no tool of registry {snap.registry!r}: the patterns an "
                "admin bound to it (SHORTLIST_QUERY_TOKEN_SCOPES) match none of its tools",
                {"registry": snap.registry},
            )
    if allowed is None:
        return _sorted_ids(visible or set())
    found: set[int] = set()
    unmatched: list[str] = []
    for pattern, hits in zip(allowed, _hits(snap, allowed), strict=True):
        seen = [t for t in hits if t in visible] if visible is not None else hits
        if seen:
            found.update(seen)
        else:  # a pattern matching only tools the token cannot see is as unmatched as a typo
            unmatched.append(pattern)
    if unmatched:
        where = (
            f"none of the tools this token may use in registry {snap.registry!r}"
            if visible is not None
            else f"no tool of registry {snap.registry!r}"
        )
        # every one in the details (a client may drop them and ask again), the first few said
        problems = [
            {"field": "allowed_tools", "message": f"{p!r} matches {where}", "pattern": p}
            for p in unmatched
        ]
        listed = ", ".join(repr(p) for p in unmatched[:_MAX_NAMED_PROBLEMS])
        more = len(unmatched) - _MAX_NAMED_PROBLEMS
        raise ValidationFailed(
            f"invalid shortlist request: allowed_tools: {listed}"
            + (f" and {more} more" if more > 0 else "")
            + f" match{'es' if len(unmatched) == 1 else ''} {where}",
            problems,
        )
    return _sorted_ids(found)


class ScopeCache:
    """Resolved scopes of recent requests, per registry version (an agent sends its toolbox on
    every step; matching thousands of names each time would cost more than the ranking)."""

    def __init__(self, size: int = _CACHED_SCOPES) -> None:
        self._size = size
        # keyed by the identity of the snapshot's name -> position map (what the ids depend
        # on; versions with the same names share it), which the entry keeps alive
        self._ids: OrderedDict[tuple[object, ...], tuple[dict[str, int], np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()

    def ids(
        self, snap: Snapshot, allowed: tuple[str, ...] | None, bound: tuple[str, ...] | None
    ) -> np.ndarray:
        """:func:`allowed_ids`, remembered while ``snap``'s tool names stay the same (errors are
        not remembered)."""
        key = (id(snap.by_name), snap.registry, allowed, bound)
        with self._lock:
            cached = self._ids.get(key)
            if cached is not None and cached[0] is snap.by_name:
                self._ids.move_to_end(key)
                return cached[1]
        ids = allowed_ids(snap, allowed, bound)
        ids.setflags(write=False)
        with self._lock:
            self._ids[key] = (snap.by_name, ids)
            while len(self._ids) > self._size:
                self._ids.popitem(last=False)
        return ids


def allows(ids: np.ndarray, tool: int) -> bool:
    """``tool`` is in ``ids`` (a resolved scope, ascending): the guard every composed list
    passes before it is shown, whatever step added its tools."""
    at = int(np.searchsorted(ids, tool))
    return at < ids.shape[0] and int(ids[at]) == tool
