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

Each tool either step adds carries its reason (``Pick.reason``), shown by ``explain``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from registry.index.graph import ToolGraph
from registry.serving.compose import Pick

__all__ = [
    "MAX_NEXT_STEPS",
    "MAX_PREREQUISITES",
    "PREREQUISITE_LEVELS",
    "after_called",
    "append_prerequisites",
    "next_steps_first",
]

MAX_PREREQUISITES = 3  # tools appended to one list
PREREQUISITE_LEVELS = 2  # a prerequisite's own prerequisite, and no further
MAX_NEXT_STEPS = 3  # successors of the called tools moved to the front

ScoreFn = Callable[[Sequence[int]], dict[int, float]]
"""First-stage scores of the given tool positions for this request."""


def append_prerequisites(
    picks: list[Pick],
    graph: ToolGraph,
    score_of: ScoreFn,
    name_of: Callable[[int], str],
    *,
    cap: int,
    called: Sequence[int] = (),
) -> list[Pick]:
    """``picks`` with the missing prerequisites of its tools appended (see the module doc);
    a need a ``called`` tool provides is met."""
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
                if len(out) >= cap or len(out) - len(picks) >= MAX_PREREQUISITES:
                    return out
                scores = score_of(providers)
                best = max(providers, key=lambda p: (scores.get(p, -np.inf), -p))
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
) -> list[Pick]:
    """The successors of the ``called`` tools (oldest call first) at the front of ``picks``.

    Named tools stay first; a successor already shown moves up; the list keeps its length
    unless it was shorter than the successors added, and never passes ``cap``.
    """
    done = set(called)
    wanted: list[tuple[int, str]] = []
    for tool in reversed(called):  # the latest call's next steps first
        nexts = [t for t in graph.successors.get(tool, ()) if t not in done]
        scores = score_of(nexts) if nexts else {}
        for t in sorted(nexts, key=lambda t: (-scores.get(t, -np.inf), t)):
            if all(t != w for w, _ in wanted):
                wanted.append((t, f"next step after {name_of(tool)} (called)"))
    wanted = wanted[:MAX_NEXT_STEPS]
    if not wanted:
        return picks
    scores = score_of([t for t, _ in wanted])
    named = [p for p in picks if p.named]
    moved = {t for t, _ in wanted}
    front = [
        next((replace(p, reason=why) for p in picks if p.tool == t and not p.named), None)
        or Pick(t, scores.get(t, 0.0), reason=why)
        for t, why in wanted
        if t not in {p.tool for p in named}
    ]
    rest = [p for p in picks if not p.named and p.tool not in moved]
    length = max(len(picks), len(named) + len(front))
    return (named + front + rest)[: min(length, cap)]
