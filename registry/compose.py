"""Composing a shortlist from rankings: one representative per group of near-duplicates,
coverage of every intent of the request, and the tools it names pinned first.

The engine ranks the whole request (the *main* ranking) and, when the request holds several
intents (:func:`registry.query.split_intents`), each intent on its own. This module turns
those rankings into the list shown:

1. **Near-duplicates fold.** Walking a ranking, a tool in the same group as one already kept
   (declared ``equivalents``, or tool embeddings with cosine >= the duplicate threshold) is
   not shown again: it becomes an *alternate* of the kept one, so five siblings take one slot.
2. **Depth per ranking.** The depth policy reads the folded main ranking (``k_0``) and each
   extra intent's ranking (``k_i``, at most :data:`MAX_EXTRA_PER_INTENT`: an intent is one
   step of the task, and its best tools come first).
3. **Coverage.** The rankings are interleaved round-robin (main first, then intents in order;
   a tool already taken is skipped) and cut at ``k_0 + sum(k_i)``: every intent's best tool
   gets in before any ranking's second-best does.
4. **Named tools first.** Tools the request names verbatim lead the list, in the order named.

The depth never exceeds the caller's cap; the engine also bounds it by
:func:`~registry.depth.policies.policy_depth_limit` (never the whole registry of 8+ tools).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from registry.feedback import EquivalenceClasses

__all__ = [
    "DUPLICATE_SIMILARITY",
    "MAX_EXTRA_PER_INTENT",
    "Folded",
    "Pick",
    "fold_duplicates",
    "interleave",
]

MAX_EXTRA_PER_INTENT = 2
DUPLICATE_SIMILARITY = 0.97  # cosine between two tools' embeddings that makes them one group

DepthFn = Callable[[np.ndarray], int]
"""Chooses a depth for a (folded) score list."""


@dataclass(frozen=True, slots=True)
class Folded:
    """A ranking with near-duplicates folded into their best-ranked representative."""

    ids: np.ndarray  # representatives, best first
    scores: np.ndarray
    alternates: dict[int, list[int]] = field(default_factory=dict)  # representative -> others


@dataclass(frozen=True, slots=True)
class Pick:
    """One tool of the composed list and why it is there."""

    tool: int
    score: float
    intent: int | None = None  # index into the request's intents (None: the whole request)
    named: bool = False
    alternates: tuple[int, ...] = ()


def fold_duplicates(
    ids: np.ndarray,
    scores: np.ndarray,
    names: Sequence[str],
    equivalence: EquivalenceClasses,
    embeddings: np.ndarray,
    threshold: float = DUPLICATE_SIMILARITY,
) -> Folded:
    """Fold ``ids`` (a ranking, best first) into representatives.

    Args:
        ids: tool positions, best first.
        scores: their scores.
        names: every tool's name, by position (read only when ``equivalence`` has classes).
        equivalence: the registry's declared equivalence classes.
        embeddings: every tool's unit embedding, by position.
        threshold: cosine at or above which two tools fold; ``> 1`` disables it.
    """
    if ids.size < 2:
        return Folded(ids, scores)
    n = ids.size
    same = np.zeros((n, n), dtype=bool)
    if threshold <= 1.0:
        vectors = embeddings[ids]
        same |= (vectors @ vectors.T) >= threshold
    if len(equivalence):
        keys = [min(equivalence.class_of(names[t])) for t in ids.tolist()]
        codes = np.unique(np.array(keys, dtype=object), return_inverse=True)[1]
        same |= codes[:, None] == codes[None, :]
    earlier = np.triu(same, 1)  # earlier[i, j]: j (ranked below i) duplicates i
    if not earlier.any():  # the common case: nothing to fold
        return Folded(ids, scores)
    kept = np.ones(n, dtype=bool)
    alternates: dict[int, list[int]] = {}
    for row in np.flatnonzero(earlier.any(axis=0)).tolist():
        owners = np.flatnonzero(earlier[:row, row] & kept[:row])
        if owners.size:
            kept[row] = False
            alternates.setdefault(int(ids[owners[0]]), []).append(int(ids[row]))
    return Folded(ids[kept], scores[kept], alternates)


def interleave(
    main: Folded,
    intents: Sequence[Folded],
    choose_depth: DepthFn,
    *,
    cap: int,
    named: Sequence[tuple[int, float]] = (),
) -> list[Pick]:
    """The composed shortlist (see the module docstring); ``cap`` bounds its length.

    Args:
        main: the folded ranking of the whole request.
        intents: folded rankings of the request's intents (empty: a single intent).
        choose_depth: the depth policy on one folded score list.
        cap: the most tools to show (named tools included).
        named: ``(tool, score)`` of the tools the request names, in the order named.
    """
    if main.ids.size == 0 and not named:
        return []
    budget = choose_depth(main.scores) if main.ids.size else 0
    lists: list[tuple[int | None, Folded]] = [(None, main)]
    for index, ranking in enumerate(intents):
        if ranking.ids.size:
            budget += min(MAX_EXTRA_PER_INTENT, choose_depth(ranking.scores))
            lists.append((index, ranking))
    picks: list[Pick] = []
    taken: set[int] = set()
    alternates: dict[int, list[int]] = {}
    for _, ranking in lists:
        for owner, others in ranking.alternates.items():
            alternates.setdefault(owner, []).extend(others)

    def take(tool: int, score: float, intent: int | None, is_named: bool) -> None:
        taken.add(tool)
        picks.append(Pick(tool, score, intent, is_named))

    for tool, score in named[:cap]:
        if tool not in taken:
            take(tool, score, None, True)
    limit = min(cap, max(budget, len(picks)))
    longest = max(ranking.ids.size for _, ranking in lists)
    for position in range(longest):
        for intent, ranking in lists:
            if len(picks) >= limit:
                break
            if position < ranking.ids.size:
                tool = int(ranking.ids[position])
                if tool not in taken:
                    take(tool, float(ranking.scores[position]), intent, False)
        if len(picks) >= limit:
            break
    return [
        Pick(p.tool, p.score, p.intent, p.named, _alternates_of(p.tool, alternates, taken))
        for p in picks
    ]


def _alternates_of(tool: int, alternates: dict[int, list[int]], taken: set[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(t for t in alternates.get(tool, ()) if t not in taken and t != tool))
