"""What a query returns: the :class:`Shortlist` (its tools, depth, timings and trace), the
``POST /shortlist`` body it writes, and what the feedback memory keeps of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from registry.feedback import ShownShortlist
from registry.feedback.events import MAX_LOGGED_QUERY_CHARS
from registry.serving.explore import DepthTrace

__all__ = ["Shortlist", "ShortlistItem"]


@dataclass(frozen=True, slots=True)
class ShortlistItem:
    name: str
    rank: int
    score: float
    definition: dict[str, Any]
    alternates: tuple[str, ...] = ()  # near-duplicates folded into this tool
    intent: int | None = None  # which of Shortlist.intents brought it (None: the whole request)
    named: bool = False  # the request names this tool verbatim
    queries: tuple[int, ...] | None = None  # with ``queries``: the requests whose lists hold it
    reason: str | None = None  # why a tool the ranking did not place is here (serving.chains)


@dataclass(frozen=True, slots=True)
class Shortlist:
    shortlist_id: str
    registry: str
    version: int
    policy: str
    scorer: str
    k: int
    n_tools: int
    p_rand: float
    bor_max_bits: float
    tools: list[ShortlistItem]
    timings: dict[str, float] = field(default_factory=dict)
    depth_bias: float | None = None  # the bor policy's operating knob used; None for other policies
    intents: tuple[str, ...] = ()  # the request's intents when it held several
    confidence: float | None = None  # P(some tool fits), computed when allow_empty was asked
    policy_version: str = ""  # the depth policy version that served it ("default", "refit-3", "gap")
    trace: DepthTrace | None = None  # adaptive depth: chosen, shown, propensity (learning loop)
    ranking: tuple[str, ...] = ()  # shown tools, then the next ones of the request's ranking

    def to_json(self) -> dict[str, Any]:
        """The ``POST /shortlist`` body (``service.schemas.ShortlistResponse``), timings left out."""
        return {
            "shortlist_id": self.shortlist_id,
            "registry": self.registry,
            "version": self.version,
            "policy": self.policy,
            "scorer": self.scorer,
            "k": self.k,
            "n_tools": self.n_tools,
            "p_rand": self.p_rand,
            "bor_max_bits": self.bor_max_bits,
            "depth_bias": self.depth_bias,
            "intents": list(self.intents),
            "confidence": self.confidence,
            "policy_version": self.policy_version,
            "tools": [_tool_json(t) for t in self.tools],
        }

    def shown(self, created: float, query: str = "", caller: str | None = None) -> ShownShortlist:
        """What the feedback memory keeps of this shortlist, served at ``created`` for ``query``
        (asked by ``caller``, a token hash)."""
        trace = self.trace
        extra = trace.shown - trace.chosen if trace is not None else 0
        return ShownShortlist(
            shortlist_id=self.shortlist_id,
            registry=self.registry,
            version=self.version,
            n_tools=self.n_tools,
            k=self.k,
            shown=tuple(t.name for t in self.tools),
            created=created,
            query=query[:MAX_LOGGED_QUERY_CHARS],
            caller=caller,
            ranking=self.ranking,
            depth_chosen=self.k - extra,
            propensity=trace.propensity if trace is not None else 1.0,
            policy_version=self.policy_version,
            margins=trace.margins if trace is not None else (),
            depth_bias=self.depth_bias,
            scores=trace.scores if trace is not None else (),
        )


def _tool_json(t: ShortlistItem) -> dict[str, Any]:
    tool = {
        "name": t.name,
        "rank": t.rank,
        "score": t.score,
        "definition": t.definition,
        "alternates": list(t.alternates),
        "intent": t.intent,
        "named": t.named,
        "reason": t.reason,
    }
    if t.queries is not None:  # only a shortlist of several queries says which brought a tool
        tool["queries"] = list(t.queries)
    return tool
