"""A fake usage event for the usage memory's and the companions' unit tests: the fields a
:class:`registry.learning.usage_events.UsageEvent` reads, each event with a fresh id."""

from __future__ import annotations

from dataclasses import dataclass

from registry.feedback import ToolCall


@dataclass(frozen=True)
class Event:
    query: str
    used: tuple[str, ...]
    shortlist_id: str
    registry: str = "r"
    success: bool | None = True
    calls: tuple[ToolCall, ...] = ()
    received: float = 1000.0
    caller: str | None = None
    shown: tuple[str, ...] = ()


_ids = iter(range(10**9))


def event(query: str, *used: str, calls: tuple[str | ToolCall, ...] = (), **kw) -> Event:
    """An event using ``used``; ``calls``: a name is a useful call of that tool."""
    return Event(query=query, used=tuple(used), shortlist_id=f"s{next(_ids)}",
                 calls=tuple(c if isinstance(c, ToolCall) else ToolCall(c, True) for c in calls), **kw)  # fmt: skip
