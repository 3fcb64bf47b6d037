"""Equivalent tools (ToolEq): groups of tools that can stand in for one another, so a shortlist
showing any of them is credited with the used one (max over equivalents)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from registry.errors import ValidationFailed

__all__ = ["EquivalenceClasses", "validate_equivalents"]


class EquivalenceClasses:
    """Functionally equivalent tools, as disjoint classes.

    Overlapping groups merge transitively (union-find): ``[a, b]`` and ``[b, c]`` make one
    class ``{a, b, c}``. A name in no group is its own singleton class.

    Attributes:
        groups: the classes of two or more names, each sorted, sorted among themselves: the
            normalised form to store and serialise.
    """

    __slots__ = ("_class_of", "groups")

    def __init__(self, groups: Iterable[Iterable[str]] = ()) -> None:
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            root = x
            while parent[root] != root:
                root = parent[root]
            while parent[x] != root:  # path compression
                parent[x], x = root, parent[x]
            return root

        for group in groups:
            names = list(dict.fromkeys(group))
            for name in names:
                parent.setdefault(name, name)
            for name in names[1:]:
                a, b = find(names[0]), find(name)
                if a != b:
                    parent[max(a, b)] = min(a, b)

        members: dict[str, list[str]] = {}
        for name in parent:
            members.setdefault(find(name), []).append(name)
        classes = sorted(tuple(sorted(m)) for m in members.values() if len(m) > 1)
        self.groups: tuple[tuple[str, ...], ...] = tuple(classes)
        self._class_of: dict[str, frozenset[str]] = {}
        for cls in classes:
            frozen = frozenset(cls)
            for name in cls:
                self._class_of[name] = frozen

    def class_of(self, name: str) -> frozenset[str]:
        """The class holding ``name``: ``{name}`` when it has no declared equivalent."""
        return self._class_of.get(name) or frozenset((name,))

    def expand(self, names: Iterable[str]) -> frozenset[str]:
        """Union of the classes of ``names``."""
        out: set[str] = set()
        for name in names:
            out |= self.class_of(name)
        return frozenset(out)

    def __len__(self) -> int:
        return len(self.groups)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EquivalenceClasses) and self.groups == other.groups

    def __hash__(self) -> int:
        return hash(self.groups)

    def __repr__(self) -> str:
        return f"EquivalenceClasses({[list(g) for g in self.groups]!r})"


def validate_equivalents(groups: Any, known: Collection[str]) -> list[list[str]]:
    """Check the ``equivalents`` field of a registry upload.

    Args:
        groups: the payload value: a list of groups, each a list of at least two distinct
            tool-name strings. ``None`` (field absent) means no equivalents.
        known: the tool names of the registry the groups refer to.

    Returns:
        The normalised groups (merged transitively, each sorted, sorted among themselves).

    Raises:
        ValidationFailed: listing every problem as ``{"field": "equivalents[i][j]",
            "message": ...}`` (plus ``"tool"`` for an unknown name).
    """
    if groups is None:
        return []
    problems: list[dict[str, Any]] = []
    if not isinstance(groups, list):
        problems.append(
            {"field": "equivalents", "message": "must be a list of lists of tool names"}
        )
        raise ValidationFailed("invalid equivalents", problems)
    known_set = known if isinstance(known, (set, frozenset, dict)) else set(known)
    clean: list[list[str]] = []
    for i, group in enumerate(groups):
        if not isinstance(group, list):
            problems.append(
                {"field": f"equivalents[{i}]", "message": "must be a list of tool names"}
            )
            continue
        names: list[str] = []
        for j, name in enumerate(group):
            field = f"equivalents[{i}][{j}]"
            if not isinstance(name, str):
                problems.append({"field": field, "message": "must be a tool name (a string)"})
            elif name not in known_set:
                problems.append(
                    {"field": field, "message": f"unknown tool {name!r}", "tool": name}
                )
            else:
                names.append(name)
        if len({name for name in group if isinstance(name, str)}) < 2:
            problems.append(
                {
                    "field": f"equivalents[{i}]",
                    "message": "a group needs at least 2 distinct tool names",
                }
            )
        clean.append(names)
    if problems:
        raise ValidationFailed(
            f"invalid equivalents: {len(problems)} problem(s)", problems
        )
    return [list(g) for g in EquivalenceClasses(clean).groups]
