"""Companions learned from feedback: which tools agents use together, and in which order.

A schema-only graph explains about half of the chains agents follow; the rest (``get_order``
before ``cancel_order``; a payment method found in the customer's record) shows in their
feedback. Every event the usage memory counts (the same admission: deduplicated, stale events
and rate-limited callers out, callers required when configured) gives the *sequence* of tools
it used: its useful calls in call order, then the ``used`` names no call reported, each tool
with positive evidence (:func:`registry.learning.usage_events.tool_evidence`) once. Per
registry :class:`CompanionCounts` adds, weighted by the evidence rule (decay and shares per
caller)::

    uses[a]            += w_a                   every tool of the sequence
    pair[a, b].uses    += min(w_a, w_b)          b after a in the sequence
    pair[a, b].callers[c] += min(w_a, w_b)       per caller (the token: ``principal``)

Every ordered pair counts, not only neighbours: a chain's third tool is the first one's
companion too (on ``bench/companions.py`` neighbours alone shipped 12 edges on STAR for +5.3
all-needed, every pair 19 for +6.7 at a shorter mean K). An edge ``a -> b`` ("b follows a") is
a candidate when its *supported* uses (a caller counts at
most as much as all the other callers together, so one caller alone supports nothing) reach
``min_uses`` from at least ``min_callers`` callers (a guard on who reported it: every counted
event), and ``b`` followed ``a`` in at least ``min_share`` of ``a``'s uses (``share``) or ``a``
preceded ``b`` in that share of ``b``'s (``back``).

A refit (:func:`fit_companions`) ships the edges: the counts without the held-out requests'
events (30% of request texts, the split every fit uses; each count scaled by the share of its
logged events outside that part) propose the candidates (a pair must have been seen there and
clear the share bar there); each is kept only
unless the held-out events contradict it: in each direction it was proposed on, the second tool
followed the first in under ``min_share`` of the held-out events holding the first (``share``),
or the first preceded the second in under that share of those holding the second (``back``).
An edge no held-out event tests is kept on its support alone. The
shipped edges travel in the registry's learning control record (every replica reads it on its
sync tick; it survives a restart and is written back after a store wipe); a wipe or a deleted
registry empties them; learning switched off stops their use.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from registry.learning.evidence import principal
from registry.learning.profiles import held_out
from registry.learning.usage_events import UsageEvent, tool_evidence

__all__ = [
    "CompanionConfig",
    "CompanionCounts",
    "PairStat",
    "candidate_edges",
    "event_sequence",
    "fit_companions",
]

MAX_SEQUENCE = 8  # tools of one event's sequence counted (its first ones)
MAX_PAIRS = 10_000  # pairs kept per registry (the weakest go first)
MAX_PAIR_CALLERS = 8  # callers kept per pair (the weakest go first): enough for the caller bars
MAX_EDGES = 1000  # edges one refit ships


@dataclass(frozen=True, slots=True)
class CompanionConfig:
    """When a counted pair becomes an edge (see the module docstring)."""

    min_uses: float = 2.0
    min_callers: int = 2
    min_share: float = 0.2  # bench/companions.py: 0.3 shipped about half the edges on STAR


@dataclass
class PairStat:
    """One ordered pair's weighted uses, in all and per caller."""

    uses: float = 0.0
    callers: dict[str, float] = field(default_factory=dict)

    def supported(self) -> float:
        """The uses no single caller carries alone: the busiest caller counts at most as much
        as all the others together."""
        if not self.callers:
            return 0.0
        top = max(self.callers.values())
        rest = sum(self.callers.values()) - top
        return min(self.uses, 2.0 * rest)


@dataclass
class CompanionCounts:
    """The pair and order counts of one registry (held in its usage memory's state)."""

    uses: dict[str, float] = field(default_factory=dict)
    pairs: dict[tuple[str, str], PairStat] = field(default_factory=dict)

    def add(self, sequence: Sequence[str], weights: dict[str, float], caller: str) -> None:
        """Count one event's sequence (``weights``: the evidence rule's weight per tool)."""
        tools, pairs = _counted(sequence)
        for tool in tools:
            self.uses[tool] = self.uses.get(tool, 0.0) + weights.get(tool, 1.0)
        for a, b in pairs:
            w = min(weights.get(a, 1.0), weights.get(b, 1.0))
            stat = self.pairs.get((a, b))
            if stat is None:
                stat = self.pairs[(a, b)] = PairStat()
            stat.uses += w
            stat.callers[caller] = stat.callers.get(caller, 0.0) + w
            if len(stat.callers) > MAX_PAIR_CALLERS:
                del stat.callers[min(stat.callers, key=lambda c: (stat.callers[c], c))]
        if len(self.pairs) > MAX_PAIRS:  # the weakest tenth goes at once: one sort per 1,000 new pairs
            weakest = sorted(self.pairs, key=lambda k: (self.pairs[k].uses, k))
            for key in weakest[: len(self.pairs) - MAX_PAIRS + MAX_PAIRS // 10]:
                del self.pairs[key]

    def fit_part(self, logged: Iterable[tuple[Sequence[str], str, bool]]) -> CompanionCounts:
        """A copy without the held-out events of ``logged`` (``(sequence, caller, held_out)``
        per logged event): each count scaled by the share of its logged events that are not
        held out, so no event both proposes an edge and tests it. Exact when the events weighed
        alike; a count whose events the log no longer holds (compacted) is kept whole."""
        total: dict[Any, int] = {}
        held: dict[Any, int] = {}
        for sequence, caller, is_held in logged:
            tools, pairs = _counted(sequence)
            keys: list[Any] = [*tools, *pairs, *((p, caller) for p in pairs)]
            for key in keys:
                total[key] = total.get(key, 0) + 1
                if is_held:
                    held[key] = held.get(key, 0) + 1

        def kept(key: Any) -> float:
            return 1.0 - held.get(key, 0) / total[key] if key in total else 1.0

        return CompanionCounts(
            {t: u * kept(t) for t, u in self.uses.items()},
            {
                pair: PairStat(s.uses * kept(pair), {c: w * kept((pair, c)) for c, w in s.callers.items()})
                for pair, s in self.pairs.items()
            },
        )

    def copy(self) -> CompanionCounts:
        return CompanionCounts(dict(self.uses), {k: PairStat(v.uses, dict(v.callers)) for k, v in self.pairs.items()})

    def drop(self, keep: Collection[str]) -> set[str]:
        """Forget the tools not in ``keep`` (deleted tools) and their pairs; the tools gone."""
        gone = {t for t in self.uses if t not in keep}
        for tool in gone:
            del self.uses[tool]
        for key in [k for k in self.pairs if k[0] not in keep or k[1] not in keep]:
            del self.pairs[key]
        return gone

    def to_json(self) -> dict[str, Any]:
        return {
            "uses": self.uses,
            "pairs": [[a, b, s.uses, s.callers] for (a, b), s in self.pairs.items()],
        }

    @classmethod
    def from_json(cls, doc: Any) -> CompanionCounts:
        if not isinstance(doc, dict):
            return cls()
        return cls(
            {str(t): float(u) for t, u in doc.get("uses", {}).items()},
            {
                (str(a), str(b)): PairStat(float(u), {str(c): float(w) for c, w in callers.items()})
                for a, b, u, callers in doc.get("pairs", ())
            },
        )


def _counted(sequence: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """The tools of a sequence that count (its first :data:`MAX_SEQUENCE`) and their ordered
    pairs: what :meth:`CompanionCounts.add` counts and :meth:`CompanionCounts.fit_part` takes
    back out, so the two always agree."""
    tools = list(sequence)[:MAX_SEQUENCE]
    return tools, list(combinations(tools, 2))


def event_sequence(
    event: UsageEvent, known: Collection[str] | None = None, evidence: Mapping[str, int] | None = None
) -> list[str]:
    """The tools ``event`` used, in order: its useful calls as called, then its ``used`` names
    no call reported; only tools with positive evidence (and in ``known``), each once.
    ``evidence``: the event's :func:`tool_evidence` when the caller already has it (the usage
    memory, which just weighed it), so it is not worked out twice."""
    evidence = tool_evidence(event) if evidence is None else evidence
    order = [c.tool for c in event.calls if c.useful] + list(event.used)
    return [
        t for t in dict.fromkeys(order) if evidence.get(t, 0) > 0 and (known is None or t in known)
    ]


def candidate_edges(
    counts: CompanionCounts, config: CompanionConfig, fit: CompanionCounts | None = None
) -> list[dict[str, Any]]:
    """The pairs that clear the caller and support bars on ``counts`` (every event: a guard on
    who reported the pair) and the share bar on ``fit`` (the fit part of a refit; default
    ``counts``), where they must have been seen; strongest first."""
    fit = counts if fit is None else fit
    out: list[dict[str, Any]] = []
    for (a, b), seen in fit.pairs.items():
        stat = counts.pairs.get((a, b))
        if stat is None or seen.uses <= 0:
            continue
        callers = sum(1 for w in stat.callers.values() if w > 0)
        supported = stat.supported()
        if callers < config.min_callers or supported < config.min_uses:
            continue
        share = seen.uses / fit.uses[a] if fit.uses.get(a) else 0.0
        back = seen.uses / fit.uses[b] if fit.uses.get(b) else 0.0
        if max(share, back) < config.min_share:
            continue
        out.append({"first": a, "then": b, "uses": round(supported, 3), "callers": callers,
                    "share": round(min(share, 1.0), 3), "back": round(min(back, 1.0), 3)})
    out.sort(key=lambda e: (-max(e["share"], e["back"]), -e["uses"], e["first"], e["then"]))
    return out[:MAX_EDGES]


def fit_companions(
    counts: CompanionCounts,
    events: Sequence[UsageEvent],
    config: CompanionConfig,
    known: Collection[str] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The edges a refit ships and how they were chosen (see the module docstring).

    Args:
        counts: the registry's counts (every event the memory counted).
        events: the registry's logged feedback events (their ``query`` splits them).
        config: the bars an edge must clear.
        known: the registry's current tools (edges of other tools are not shipped).
    """
    test: list[list[str]] = []
    logged: list[tuple[list[str], str, bool]] = []
    for e in events:
        sequence = event_sequence(e, known)
        if not sequence:
            continue
        is_held = bool(e.query) and held_out(e.query)
        logged.append((sequence, principal(e.caller), is_held))
        if is_held:
            test.append(sequence)
    fit_counts = counts.fit_part(logged)
    proposed = [
        e for e in candidate_edges(counts, config, fit_counts)
        if known is None or (e["first"] in known and e["then"] in known)
    ]
    kept: list[dict[str, Any]] = []
    refused = 0
    for edge in proposed:
        tests = [_held_out_test(edge, test, d) for d in ("share", "back") if edge[d] >= config.min_share]
        tried = [(tries, confirmed) for tries, confirmed in tests if tries]
        if tried and all(confirmed / tries < config.min_share for tries, confirmed in tried):
            refused += 1
            continue
        tries = sum(t for t, _ in tried)
        share = sum(c for _, c in tried) / tries if tries else None
        kept.append({**edge, "held_out_tries": tries, "held_out_share": None if share is None else round(share, 3)})
    fit = {
        "pairs": len(counts.pairs),
        "held_out_events": len(test),
        "proposed": len(proposed),
        "refused_on_held_out": refused,
        "shipped": len(kept),
        "min_uses": config.min_uses,
        "min_callers": config.min_callers,
        "min_share": config.min_share,
    }
    return kept, fit


def _held_out_test(edge: dict[str, Any], test: Sequence[Sequence[str]], direction: str) -> tuple[int, int]:
    """``(tries, confirmed)`` of an edge on held-out sequences in one direction: ``share``, the
    sequences holding its first tool and how many used the second after it; ``back``, those
    holding its second tool and how many used the first before it."""
    a, b = edge["first"], edge["then"]
    if direction == "share":
        tried = [list(s) for s in test if a in s]
        return len(tried), sum(1 for s in tried if b in s[s.index(a) + 1 :])
    tried = [list(s) for s in test if b in s]
    return len(tried), sum(1 for s in tried if a in s[: s.index(b)])
