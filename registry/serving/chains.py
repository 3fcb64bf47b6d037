"""Chains of tools in a shortlist: prerequisites appended, next steps after the tools called.

Two uses of the registry's prerequisite graph (:class:`registry.index.graph.ToolGraph`):

* **Prerequisites** (:func:`append_prerequisites`): for each shown tool, in list order, each of
  its needs that no shown tool provides gets its best provider (by the provider's first-stage
  score for this request) appended, then the same for the appended tools (two levels). The list
  only grows: no ranked tool is replaced (replacing tail tools cost all-needed 2.1 points in
  the pilot), never past the cap, at most :data:`MAX_PREREQUISITES` tools. A fixed ``k`` means
  exactly ``k`` tools, so it is never applied there.
* **After the calls** (:func:`after_called`, :func:`next_steps_first`): the list is the request's
  ranking without the tools the agent already called (it holds them; a tool the request names
  is still shown), as deep as the list the request gets without ``called``; then the tools the
  called ones are a prerequisite of (their successors, the latest call first) come first. On
  ``bench/chains.py``'s eight ordered sources this showed the next needed tool about as often
  as keeping the composed list and passing the called tools' slots down it (0.875 vs 0.871 on
  average: tooltalk 0.873 vs 0.836, star 0.860 vs 0.830, nestools 0.807 vs 0.831), and more
  simply; letting the policy cut the ranking without them made lists about one tool longer.

* **Learned companions** (:class:`Companions`, :func:`append_companions`): pairs of tools
  agents used one after the other, learned from feedback (:mod:`registry.learning.companions`)
  and shipped by a refit. They add to the read graph and override it: a learned predecessor is
  the provider chosen for a need it can fill, the learned next steps of a called tool come
  before its read successors, and after the prerequisites a shown tool's learned companion is
  appended (after them, so the companion's slot never goes to a tool the read graph adds). An edge an admin removed is never learned back.
  Their budget is tighter than the read graph's (:data:`MAX_COMPANIONS` per list, only for the
  first :data:`COMPANION_ANCHORS` shown tools, only pairs whose share clears
  :data:`APPEND_SHARE`): appended as freely as prerequisites they cost 0.6-2.5 tools per list;
  with this budget 0.0-0.5 (``bench/companions.py``, docs/chains.md).

Each tool either step adds carries its reason (``Pick.reason``), shown by ``explain``. A scoped
request (``allowed``) only ever adds tools of its scope.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice

import numpy as np

from registry.index.graph import ToolGraph
from registry.serving.compose import Pick

__all__ = [
    "APPEND_SHARE",
    "COMPANION_ANCHORS",
    "MAX_COMPANIONS",
    "MAX_NEXT_STEPS",
    "MAX_PREREQUISITES",
    "NO_COMPANIONS",
    "PREREQUISITE_LEVELS",
    "Companions",
    "LearnedEdge",
    "after_called",
    "append_companions",
    "append_prerequisites",
    "next_steps_first",
]

MAX_PREREQUISITES = 3  # tools appended to one list
PREREQUISITE_LEVELS = 2  # a prerequisite's own prerequisite, and no further
MAX_NEXT_STEPS = 3  # successors of the called tools moved to the front

MAX_COMPANIONS = 2  # learned companions appended to one list
COMPANION_ANCHORS = 2  # the shown tools (from the top) whose companions may be appended
APPEND_SHARE = 0.5  # a companion is appended (or put first after a call) when it came this often

ScoreFn = Callable[[Sequence[int]], dict[int, float]]
"""First-stage scores of the given tool positions for this request."""
Allowed = Callable[[int], bool]
"""Whether a tool may be added (a scoped request's scope)."""


def _anything(tool: int) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class LearnedEdge:
    """``first`` -> ``then``: agents used ``then`` after ``first`` (learned from feedback).

    ``share`` is the fraction of the uses of ``first`` followed by ``then`` (``back``: of the
    uses of ``then`` preceded by ``first``); ``callers`` distinct callers reported it."""

    first: int
    then: int
    uses: float
    callers: int
    share: float
    back: float

    def why(self, anchor: str) -> str:
        return f"learned companion of {anchor} ({self.callers} callers, {round(self.uses)} uses)"


@dataclass(frozen=True, slots=True)
class Companions:
    """A registry's learned edges by position (built per snapshot from the shipped edges)."""

    after: Mapping[int, tuple[LearnedEdge, ...]] = field(default_factory=dict)  # first -> edges
    before: Mapping[int, tuple[LearnedEdge, ...]] = field(default_factory=dict)  # then -> edges

    def __bool__(self) -> bool:
        return bool(self.after)

    @classmethod
    def of(cls, edges: Iterable[LearnedEdge]) -> Companions:
        after: dict[int, list[LearnedEdge]] = {}
        before: dict[int, list[LearnedEdge]] = {}
        for edge in edges:
            after.setdefault(edge.first, []).append(edge)
            before.setdefault(edge.then, []).append(edge)
        return cls(
            {t: tuple(sorted(es, key=lambda e: (-e.share, -e.uses, e.then))) for t, es in after.items()},
            {t: tuple(sorted(es, key=lambda e: (-e.back, -e.uses, e.first))) for t, es in before.items()},
        )

    def precedes(self, first: int, then: int) -> bool:
        return any(e.then == then for e in self.after.get(first, ()))


NO_COMPANIONS = Companions()


def append_companions(
    picks: list[Pick],
    companions: Companions,
    score_of: ScoreFn,
    name_of: Callable[[int], str],
    *,
    cap: int,
    called: Sequence[int] = (),
    allowed: Allowed = _anything,
) -> list[Pick]:
    """``picks`` with the strongest learned companions of its first :data:`COMPANION_ANCHORS`
    shown tools appended: tools that followed one of them (or preceded it) in at least
    :data:`APPEND_SHARE` of its uses; at most :data:`MAX_COMPANIONS`, never past ``cap``,
    never a tool shown or called."""
    if not companions or len(picks) >= cap:
        return picks
    shown = {p.tool for p in picks} | set(called)
    best: list[tuple[float, float, int, int, str]] = []  # (-share, -uses, order, tool, reason)
    for order, pick in enumerate(picks[:COMPANION_ANCHORS]):
        anchor = name_of(pick.tool)
        for e in companions.after.get(pick.tool, ()):
            if e.share >= APPEND_SHARE and e.then not in shown and allowed(e.then):
                best.append((-e.share, -e.uses, order, e.then, e.why(anchor)))
        for e in companions.before.get(pick.tool, ()):
            if e.back >= APPEND_SHARE and e.first not in shown and allowed(e.first):
                best.append((-e.back, -e.uses, order, e.first, e.why(anchor)))
    out = list(picks)
    for _, _, _, tool, why in sorted(best):
        if len(out) >= cap or len(out) - len(picks) >= MAX_COMPANIONS:
            break
        if tool not in shown:
            out.append(Pick(tool, score_of([tool]).get(tool, 0.0), reason=why))
            shown.add(tool)
    return out


def append_prerequisites(
    picks: list[Pick],
    graph: ToolGraph,
    score_of: ScoreFn,
    name_of: Callable[[int], str],
    *,
    cap: int,
    called: Sequence[int] = (),
    allowed: Allowed = _anything,
    companions: Companions = NO_COMPANIONS,
) -> list[Pick]:
    """``picks`` with the missing prerequisites of its tools appended (see the module doc);
    a need a ``called`` tool provides is met; a provider agents were seen to use before the
    tool (``companions``) is chosen first; only ``allowed`` tools are added."""
    if not graph.needs or len(picks) >= cap:
        return picks
    out = list(picks)
    shown = {p.tool for p in picks} | set(called)
    frontier = list(picks)
    for _ in range(PREREQUISITE_LEVELS):
        added: list[Pick] = []
        for pick in frontier:
            for param, providers in graph.needs.get(pick.tool, ()):
                if any(p in shown for p in providers):
                    continue
                providers = tuple(p for p in providers if allowed(p))
                if not providers:
                    continue
                if len(out) >= cap or len(out) - len(picks) >= MAX_PREREQUISITES:
                    return out
                scores = score_of(providers)
                best = max(
                    providers,
                    key=lambda p: (companions.precedes(p, pick.tool), scores.get(p, -np.inf), -p),
                )
                reason = f"prerequisite of {name_of(pick.tool)}: fills {param!r}"
                new = Pick(best, scores.get(best, 0.0), reason=reason)
                out.append(new)
                added.append(new)
                shown.add(best)
        frontier = added
        if not frontier:
            break
    return out


def after_called(
    ranking: tuple[np.ndarray, np.ndarray], named: Sequence[tuple[int, float]], called: Sequence[int], depth: int
) -> list[Pick]:
    """The list after ``called``: the tools the request names, then the request's ranking
    without the called tools, ``depth`` tools in all (the depth chosen for the request)."""
    picks = [Pick(t, s, None, True) for t, s in named[:depth]]
    skip = {p.tool for p in picks} | set(called)
    for tool, score in zip(ranking[0].tolist(), ranking[1].tolist()):
        if len(picks) >= depth:
            break
        if tool not in skip:
            picks.append(Pick(int(tool), float(score)))
            skip.add(tool)
    return picks


def next_steps_first(
    picks: list[Pick],
    graph: ToolGraph,
    called: Sequence[int],
    score_of: ScoreFn,
    name_of: Callable[[int], str],
    *,
    cap: int,
    allowed: Allowed = _anything,
    companions: Companions = NO_COMPANIONS,
) -> list[Pick]:
    """The successors of the ``called`` tools (oldest call first) at the front of ``picks``.

    Named tools stay first; a successor already shown moves up; the list keeps its length
    unless it was shorter than the successors added, and never passes ``cap``. The learned
    next steps of a called tool (``companions``) that followed it in at least
    :data:`APPEND_SHARE` of its uses come before its read successors (a weaker follower would
    push a ranked tool out: on API-Bank, where a token precedes every action, learned next
    steps of any share cut the next tool shown from 0.95 to 0.56).
    """
    done = set(called)
    wanted: dict[int, str] = {}  # tool -> why, in order; a tool's first reason stays
    for tool in reversed(called):  # the latest call's next steps first
        for e in companions.after.get(tool, ()):  # only a strong follower takes a ranked tool's place
            if e.share < APPEND_SHARE:
                break  # sorted by share
            if e.then not in done and allowed(e.then):
                wanted.setdefault(e.then, f"next step after {name_of(tool)} (called): {e.why(name_of(tool))}")
        nexts = [t for t in graph.successors.get(tool, ()) if t not in done and allowed(t)]
        scores = score_of(nexts) if nexts else {}
        for t in sorted(nexts, key=lambda t: (-scores.get(t, -np.inf), t)):
            wanted.setdefault(t, f"next step after {name_of(tool)} (called)")
    moved = dict(islice(wanted.items(), MAX_NEXT_STEPS))
    if not moved:
        return picks
    scores = score_of(list(moved))
    named = [p for p in picks if p.named]
    named_tools = {p.tool for p in named}
    ranked: dict[int, Pick] = {}
    for p in picks:
        if not p.named:
            ranked.setdefault(p.tool, p)
    front = [
        replace(ranked[t], reason=why) if t in ranked else Pick(t, scores.get(t, 0.0), reason=why)
        for t, why in moved.items()
        if t not in named_tools
    ]
    rest = [p for p in picks if not p.named and p.tool not in moved]
    length = max(len(picks), len(named) + len(front))
    return (named + front + rest)[: min(length, cap)]
