"""Typed responses of the tool-shortlist HTTP API.

Every model ignores fields it does not know, so a newer server that adds fields never breaks
an older client.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ShortlistTool(_Model):
    """One tool of a shortlist."""

    name: str
    rank: int
    score: float
    definition: dict[str, Any] = Field(default_factory=dict)
    alternates: list[str] = Field(default_factory=list)
    intent: int | None = None
    named: bool = False
    queries: list[int] | None = None
    """With several ``queries``: the indices of the requests whose lists hold this tool."""
    reason: str | None = None  # why a tool the ranking did not place is here (a prerequisite, a next step)


class DepthExplanation(_Model):
    """How the bor policy chose the depth (``explain=True``): the STOP - CONTINUE margin (bits)
    at each depth of the request's own ranking, the bias a margin must reach, the depth chosen
    and the depth shown (deeper only when exploring)."""

    margins: list[float] = Field(default_factory=list)
    bias: float = 0.0
    chosen: int = 0
    shown: int = 0


class Shortlist(_Model):
    """The response of ``POST /shortlist``."""

    shortlist_id: str
    registry: str
    version: int
    policy: str
    scorer: str
    k: int
    n_tools: int
    p_rand: float
    bor_max_bits: float
    depth_bias: float | None = None
    intents: list[str] = Field(default_factory=list)
    confidence: float | None = None
    policy_version: str = ""
    """The depth policy version that served it ('default', a refit such as 'refit-3', or the
    policy name for 'fixed'/'gap'); empty from a server that predates it."""
    explain: DepthExplanation | None = None
    tools: list[ShortlistTool] = Field(default_factory=list)

    @property
    def names(self) -> list[str]:
        """Tool names in shortlist order."""
        return [tool.name for tool in self.tools]

    @property
    def definitions(self) -> list[dict[str, Any]]:
        """Tool definitions (as uploaded) in shortlist order."""
        return [tool.definition for tool in self.tools]


class MatchFlags(_Model):
    exact: bool
    equivalent: bool


class MatchValues(_Model):
    exact: float
    equivalent: float


class FeedbackResult(_Model):
    """The response of ``POST /feedback``."""

    shortlist_id: str
    registry: str
    duplicate: bool
    presented: MatchFlags
    p_rand: MatchValues


class ToolCall(_Model):
    """One call of an agent's trajectory, for feedback."""

    tool: str
    useful: bool


class RegistryInfo(_Model):
    """A registry's name, current version and size."""

    registry: str
    version: int
    tools: int


class Registry(_Model):
    """A registry's current version with its tool definitions as uploaded."""

    registry: str
    version: int
    tools: list[dict[str, Any]]
    equivalents: list[list[str]] = Field(default_factory=list)


class ToolUsage(_Model):
    name: str
    shown: int
    used: int
    useful_calls: int
    useless_calls: int
    aggregate_utility: int
    efficiency: float | None = None


class ToolReport(_Model):
    """The tool-efficiency report of ``GET /registries/{registry}/report``."""

    registry: str
    events: int
    mean_trajectory_efficiency: float | None = None
    prune_candidates: list[str] = Field(default_factory=list)
    tools: list[ToolUsage] = Field(default_factory=list)
