"""Several requests in one call (``queries``): one shortlist holding each request's own list.

An agent planning a few steps ("find the customer", "refund the charge", "email a receipt")
asks once instead of once per step. Each request is answered on the same registry snapshot as
a request of its own would be (its own ranking, named tools and depth: ``k`` and ``max_k`` apply
to each), then the lists are merged:

* **round-robin**: every request's first tool, then every request's second, ..., in request
  order, so no request's best tool waits behind another's long tail;
* **deduplicated by name**: a tool two requests both bring takes one slot, placed where the
  first of them put it, and is tagged with every request whose list holds it (``queries``:
  indices into the request's ``queries``);
* ``intents`` are the requests' intents one after the other, each tool's ``intent`` pointing
  into that list.

The merged list has one ``shortlist_id``: feedback on it is checked, counted and reported as
for any shortlist. It carries no depth trace and no single query text, so the learning loop
(usage memory, depth refits) leaves it out: its feedback cannot say which request's ranking or
depth it judges.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar, Protocol, TypeVar

from registry import bor

__all__ = ["merge_shortlists"]


class Answered(Protocol):
    """What merging reads of a :class:`registry.serving.result.Shortlist` (named by its
    fields, not imported: the query runner imports this module)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def tools(self) -> Sequence[Any]: ...  # ShortlistItem: name, intent, named, rank, queries
    @property
    def intents(self) -> tuple[str, ...]: ...
    @property
    def timings(self) -> dict[str, float]: ...
    @property
    def confidence(self) -> float | None: ...
    @property
    def n_tools(self) -> int: ...


S = TypeVar("S", bound=Answered)


def merge_shortlists(parts: Sequence[S], shortlist_id: str) -> S:
    """One shortlist of ``parts`` (one per request, same snapshot), merged as the module says."""
    first = parts[0]
    holders: dict[str, list[int]] = {}
    named: set[str] = set()  # a tool one request names is named in the merged list too
    for index, part in enumerate(parts):
        for tool in part.tools:
            holders.setdefault(tool.name, []).append(index)
            if tool.named:
                named.add(tool.name)
    offsets: list[int] = []
    intents: list[str] = []
    for part in parts:
        offsets.append(len(intents))
        intents.extend(part.intents)
    placed: dict[str, Any] = {}
    for depth in range(max(len(part.tools) for part in parts)):
        for index, part in enumerate(parts):
            if depth >= len(part.tools) or part.tools[depth].name in placed:
                continue
            tool = part.tools[depth]
            placed[tool.name] = replace(
                tool,
                rank=len(placed) + 1,
                intent=None if tool.intent is None else tool.intent + offsets[index],
                named=tool.name in named,
                queries=tuple(holders[tool.name]),
            )
    items = list(placed.values())
    n, k = first.n_tools, len(items)
    p_rand = bor.p_rand(n, 1, k) if n and k else 0.0
    timings: dict[str, float] = {}
    for part in parts:
        for stage, seconds in part.timings.items():
            timings[stage] = timings.get(stage, 0.0) + seconds
    confidences = [p.confidence for p in parts if p.confidence is not None]
    return replace(
        first,
        shortlist_id=shortlist_id,
        k=k,
        p_rand=p_rand,
        bor_max_bits=0.0 - math.log2(p_rand) if p_rand > 0 else 0.0,
        tools=items,
        timings=timings,
        intents=tuple(intents),
        confidence=max(confidences) if confidences else None,
        trace=None,
        ranking=tuple(placed),
    )
