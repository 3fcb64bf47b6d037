"""Composing a shortlist from rankings: one representative per group of near-duplicates,
coverage of every intent of the request, and the tools it names pinned first.

The engine ranks the whole request (the *main* ranking) and, when the request holds several
intents (:func:`registry.serving.intents.split_intents`), each intent on its own. This module turns
those rankings into the list shown:

1. **Near-duplicates fold.** Walking a ranking, a tool in the same group as one already kept
   (declared ``equivalents``, or tool embeddings with cosine >= the duplicate threshold) is
   not shown again: it becomes an *alternate* of the kept one, so five siblings take one slot.
2. **Depth per ranking.** The depth policy reads the folded main ranking (``k_0``) and each
   intent's ranking (``k_i``); an intent adds at most ``m_i = min(k_i,``
   :data:`MAX_EXTRA_PER_INTENT` ``)`` tools.
3. **Coverage.** A *step* ("then email it", "and save it", "Book a table.") is an explicit
   part of the task: in its turns of the round-robin it takes the next ``m_i`` tools of its
   own ranking not taken yet, so it lengthens the list even when the main ranking holds its
   best tool. A weaker
   intent (a further question, a noun phrase after ", and") adds its top ``m_i`` tools only
   when the policy is confident about it (``k_i <=`` :data:`INTENT_CONFIDENT_DEPTH`), and adds
   no length when the list already holds them: a single-tool request written in several
   sentences stays short. The contributions are merged round-robin (main first, then the
   intents in order), so every intent's best tool comes before any second-best. On the
   dev sets this trades a little efficiency on single-tool requests (BFCL live: mean K 2.62
   -> 2.93 at the same found rate) for every-needed-tool coverage on multi-tool ones
   (StableToolBench 17% -> 48%, hand-written MCP tasks 32% -> 49%; docs/results/multi-tool.md).
4. **Named tools first.** Tools the request names verbatim lead the list, in the order named.

The depth never exceeds the caller's cap; the engine also bounds it by
:func:`~registry.serving.depth_policies.policy_depth_limit` (never the whole registry of 8+ tools).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from registry.feedback import EquivalenceClasses

__all__ = [
    "DUPLICATE_SIMILARITY",
    "INTENT_CONFIDENT_DEPTH",
    "MAX_EXTRA_PER_INTENT",
    "Folded",
    "Pick",
    "fold_duplicates",
    "interleave",
]

MAX_EXTRA_PER_INTENT = 2
INTENT_CONFIDENT_DEPTH = 3  # an intent the policy would cut deeper than this has no clear tool
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
    reason: str | None = None  # why a tool the ranking did not place is here (serving.chains)


def fold_duplicates(
    ids: np.ndarray,
    scores: np.ndarray,
    names: Sequence[str] | Mapping[int, str],
    equivalence: EquivalenceClasses,
    embeddings: np.ndarray,
    threshold: float = DUPLICATE_SIMILARITY,
) -> Folded:
    """Fold ``ids`` (a ranking, best first) into representatives.

    Args:
        ids: tool positions, best first.
        scores: their scores.
        names: the tools' names by position, at least of ``ids`` (read only when
            ``equivalence`` has classes).
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
    intents: Sequence[tuple[Folded, bool]],
    choose_depth: DepthFn,
    *,
    cap: int,
    named: Sequence[tuple[int, float]] = (),
    intent_depth: Callable[[int, np.ndarray], int] | None = None,
) -> list[Pick]:
    """The composed shortlist (see the module docstring); ``cap`` bounds its length.

    Args:
        main: the folded ranking of the whole request.
        intents: ``(folded ranking, is_step)`` of each of the request's intents (empty: one).
        choose_depth: the depth policy on one folded score list.
        cap: the most tools to show (named tools included).
        named: ``(tool, score)`` of the tools the request names, in the order named.
        intent_depth: ``(intent index, folded scores) -> depth`` for the intents' rankings
            (a needs-aware policy reads each intent's own text); default ``choose_depth``.
    """
    if main.ids.size == 0 and not named:
        return []
    picks: list[Pick] = []
    taken: set[int] = set()
    alternates: dict[int, list[int]] = {}
    for ranking in (main, *(r for r, _ in intents)):
        for owner, others in ranking.alternates.items():
            alternates.setdefault(owner, []).extend(others)

    def take(tool: int, score: float, intent: int | None, is_named: bool = False) -> None:
        taken.add(tool)
        picks.append(Pick(tool, score, intent, is_named))

    for tool, score in named[:cap]:
        if tool not in taken:
            take(tool, score, None, True)
    k0 = choose_depth(main.scores) if main.ids.size else 0
    shares = []  # (intent index, ranking, how many it adds, is a step)
    for index, (ranking, step) in enumerate(intents):
        if ranking.ids.size:
            depth = intent_depth(index, ranking.scores) if intent_depth else choose_depth(ranking.scores)
            if step or depth <= INTENT_CONFIDENT_DEPTH:
                shares.append((index, ranking, min(MAX_EXTRA_PER_INTENT, depth), step))
    added = [0] * len(shares)
    cursor = [0] * len(shares)
    for position in range(max([k0, *(share[2] for share in shares)], default=0)):
        if position < k0 and len(picks) < cap and int(main.ids[position]) not in taken:
            take(int(main.ids[position]), float(main.scores[position]), None)
        for slot, (index, ranking, quota, step) in enumerate(shares):
            if len(picks) >= cap or added[slot] >= quota:
                continue
            if step:  # the next tool of this intent not shown yet
                while cursor[slot] < ranking.ids.size and int(ranking.ids[cursor[slot]]) in taken:
                    cursor[slot] += 1
                row = cursor[slot]
            else:  # its own prefix, wherever the list already holds it
                row = position
            added[slot] += 1
            if row < ranking.ids.size and int(ranking.ids[row]) not in taken:
                take(int(ranking.ids[row]), float(ranking.scores[row]), index)
    return [
        Pick(p.tool, p.score, p.intent, p.named, _alternates_of(p.tool, alternates, taken))
        for p in picks
    ]


def _alternates_of(tool: int, alternates: dict[int, list[int]], taken: set[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(t for t in alternates.get(tool, ()) if t not in taken and t != tool))
