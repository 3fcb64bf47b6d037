"""What the usage memory reads of a feedback event, its knobs, and the evidence an event gives
each tool it reports (the rule is in :mod:`registry.learning.usage`'s docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from registry.learning.evidence import EvidenceConfig

__all__ = ["UsageConfig", "UsageEvent", "tool_evidence"]


class _Call(Protocol):
    @property
    def tool(self) -> str: ...
    @property
    def useful(self) -> bool: ...


class UsageEvent(Protocol):
    """What the memory reads of a feedback event (``registry.feedback.FeedbackEvent``)."""

    @property
    def shortlist_id(self) -> str: ...
    @property
    def registry(self) -> str: ...
    @property
    def used(self) -> tuple[str, ...]: ...
    @property
    def success(self) -> bool | None: ...
    @property
    def calls(self) -> Sequence[_Call]: ...
    @property
    def received(self) -> float: ...
    @property
    def query(self) -> str: ...
    @property
    def caller(self) -> str | None: ...
    @property
    def shown(self) -> tuple[str, ...]: ...


@dataclass(frozen=True, slots=True)
class UsageConfig:
    """Knobs of the usage memory (from ``SHORTLIST_LEARNING_*`` settings in the service)."""

    per_tool: int = 64
    per_registry: int = 20_000
    dedupe: float = 0.95
    similarity: float = 0.8
    beta: float = 0.3
    n0: float = 2.0
    candidates: int = 10
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)
    profile_n0: float = 2.0
    profile_center: bool = False  # profile cosines about the registry's mean request (profiles.py)
    profile_unseen_guard: bool = True  # a profile lift never passes an unprofiled tool ranked above
    require_caller: bool = False


def tool_evidence(event: UsageEvent) -> dict[str, int]:
    """+1 / -1 per tool the event reports (see the module docstring); 0-evidence tools left out."""
    calls: dict[str, list[bool]] = {}
    for call in event.calls:
        calls.setdefault(call.tool, []).append(bool(call.useful))
    out: dict[str, int] = {}
    for tool in dict.fromkeys((*event.used, *calls)):
        flags = calls.get(tool)
        if flags and any(flags):
            out[tool] = 1
        elif flags:
            out[tool] = -1
        elif event.success is not False:
            out[tool] = 1
    return out
