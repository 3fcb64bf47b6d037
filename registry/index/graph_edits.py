"""An admin's edits to a registry's prerequisite graph: edges added and removed by tool names,
kept with the registry's version and applied on top of the graph read from the tools
(:mod:`registry.index.graph`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_EDGE_EDITS", "NO_EDITS", "EdgeEdits", "edge_list_problems"]


@dataclass(frozen=True, slots=True)
class EdgeEdits:
    """An admin's changes to the read graph: edges added and removed, by tool names."""

    added: tuple[tuple[str, str], ...] = ()  # (provider, consumer)
    removed: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)

    def to_json(self) -> dict[str, list[list[str]]]:
        return {"added": [list(e) for e in self.added], "removed": [list(e) for e in self.removed]}

    @classmethod
    def from_json(cls, data: Any) -> EdgeEdits:
        if not isinstance(data, dict):
            return cls()
        return cls(
            tuple((str(a), str(b)) for a, b in data.get("added", ())),
            tuple((str(a), str(b)) for a, b in data.get("removed", ())),
        )

    def changed(self, add: Iterable[tuple[str, str]], remove: Iterable[tuple[str, str]]) -> EdgeEdits:
        """These edits, then ``add`` and ``remove`` (a later edit of one edge wins)."""
        added = dict.fromkeys(self.added)
        removed = dict.fromkeys(self.removed)
        for edge in add:
            removed.pop(edge, None)
            added[edge] = None
        for edge in remove:
            added.pop(edge, None)
            removed[edge] = None
        return EdgeEdits(tuple(added), tuple(removed))

    def kept(self, known: Iterable[str]) -> EdgeEdits:
        """The edits whose two tools both still exist (a deleted tool takes its edits)."""
        names = set(known)
        return EdgeEdits(
            tuple(e for e in self.added if e[0] in names and e[1] in names),
            tuple(e for e in self.removed if e[0] in names and e[1] in names),
        )


NO_EDITS = EdgeEdits()
MAX_EDGE_EDITS = 1000  # edges one edit may add or remove


def edge_list_problems(field_name: str, edges: Any) -> list[dict[str, str]]:
    """What is wrong with an edit's ``add`` or ``remove`` list (empty: nothing)."""
    if edges is None:
        return []
    shape = isinstance(edges, list) and all(
        isinstance(e, list) and len(e) == 2 and all(isinstance(n, str) and n for n in e) for e in edges
    )
    if not shape:
        return [{"field": field_name, "message": f"{field_name}: must be a list of [provider, consumer] tool names"}]
    if len(edges) > MAX_EDGE_EDITS:
        return [{"field": field_name, "message": f"{field_name}: {len(edges)} edges; the limit is {MAX_EDGE_EDITS}"}]
    loops = [e[0] for e in edges if e[0] == e[1]]
    if loops:
        return [{"field": field_name, "message": f"{field_name}: a tool cannot be its own prerequisite: {loops[:5]}"}]
    return []
