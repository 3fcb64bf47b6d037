"""Bodies of the admin routes: registries, their graph, their learning (these become the OpenAPI
schema)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from registry.index.graph import EdgeSource


class RegistryInfoOut(BaseModel):
    registry: str = Field(examples=["payments"])
    version: int = Field(examples=[3])
    tools: int = Field(description="Number of tools in this version.", examples=[42])
    written_at: float | None = Field(
        None,
        description="Unix time (seconds) this version was written; null if it predates the field.",
        examples=[1764561600.0],
    )


class RegistryList(BaseModel):
    registries: list[RegistryInfoOut]


class RegistryOut(BaseModel):
    registry: str
    version: int
    written_at: float | None = Field(None, description="Unix time this version was written.")
    tools: list[dict[str, Any]] = Field(description="Tool definitions exactly as uploaded.")
    equivalents: list[list[str]] = Field(
        default_factory=list, description="Groups of tools that can do the same job."
    )
    embedder: str | None = Field(
        None,
        description="Model id of the embedder this version's vectors came from "
        "(SHORTLIST_EMBEDDER; a registry is re-embedded when it changes).",
        examples=["all-MiniLM-L6-v2/onnx-int8-dynamic/3f1c0e9a2b7d"],
    )


class GraphEdge(BaseModel):
    provider: str = Field(description="Call this tool first: it yields what the consumer needs.")
    consumer: str
    param: str = Field(description="The consumer's parameter the provider fills ('' for an added edge).")
    source: EdgeSource = Field(
        description="What the edge was read from: the names and required id parameters, an "
        "outputSchema, a description, a parameter's description naming the tool, or an admin."
    )
    evidence: str = Field(examples=["'film_id' names film; its name searches film"])


class GraphEdits(BaseModel):
    added: list[list[str]] = Field(default_factory=list, description="[provider, consumer] pairs.")
    removed: list[list[str]] = Field(default_factory=list, description="[provider, consumer] pairs.")


class LearnedCompanion(BaseModel):
    """A companion edge learned from agents' feedback: ``then`` followed ``first``."""

    first: str = Field(description="The tool used first.")
    then: str = Field(description="The tool used after it.")
    uses: float = Field(description="Weighted uses of the pair that no single caller carries alone.")
    callers: int = Field(description="Distinct callers who reported the pair.")
    share: float = Field(description="Share of the uses of 'first' followed by 'then'.")
    back: float = Field(description="Share of the uses of 'then' preceded by 'first'.")
    held_out_tries: int = Field(0, description="Held-out requests that tested the edge at the refit.")
    held_out_share: float | None = Field(None, description="How often the pair recurred on them.")
    active: bool = Field(description="Used by shortlists (false: an admin removed it, or learning is off).")


class RegistryGraph(BaseModel):
    """A registry version's prerequisite graph (read from its tools at upload, plus edits)."""

    registry: str
    version: int
    edges: list[GraphEdge]
    edits: GraphEdits = Field(description="The admins' edits this version carries.")
    learned: list[LearnedCompanion] = Field(
        default_factory=list,
        description="Companions learned from feedback and shipped by the last refit (docs/chains.md).",
    )


class GraphEditRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    add: list[list[str]] = Field(
        default_factory=list, description="[provider, consumer] edges to add.", max_length=1000
    )
    remove: list[list[str]] = Field(
        default_factory=list, description="[provider, consumer] edges to remove.", max_length=1000
    )


class ToolUsage(BaseModel):
    name: str
    shown: int = Field(description="Feedback events whose shortlist showed this tool.")
    used: int = Field(description="Feedback events that reported this tool as used.")
    useful_calls: int
    useless_calls: int
    aggregate_utility: int = Field(description="useful_calls - useless_calls (sum of signs).")
    efficiency: float | None = Field(description="useful_calls / calls; null without calls.")


class CallerShare(BaseModel):
    caller: str | None = Field(description="Hash of the caller's token; null without tokens.")
    events: int = Field(description="Its feedback events that counted.")
    share: float = Field(description="Its share of the registry's counted events.")


class ToolProfile(BaseModel):
    tool: str
    evidence: float = Field(description="Weighted feedback events behind the tool's usage profile.")
    shrink: float = Field(description="evidence / (evidence + n0): how far its profile counts.")


class LearningReport(BaseModel):
    """What the usage memory learned for a registry (docs/learning.md)."""

    enabled: bool = Field(description="Feedback lifts rankings now: on globally and for this registry.")
    global_enabled: bool = Field(description="SHORTLIST_LEARNING.")
    registry_enabled: bool = Field(description="This registry's switch (PUT .../learning).")
    events: int = Field(description="Feedback events counted as evidence.")
    skipped: dict[str, int] = Field(
        description="Events not counted, by reason: untrusted (no token), rate_limited (the "
        "caller's events this minute), stale, no_query, no_evidence."
    )
    profile_weight: float = Field(
        description="Fusion weight of the usage profiles in the ranking, fitted by the last refit "
        "on this registry's logged feedback (0: profiles do not lift)."
    )
    profile_fit: dict[str, Any] | None = Field(
        description="How that weight was chosen (held-out events, reciprocal rank per weight, gain)."
    )
    similarity: float = Field(
        description="Cosine from which a past request lifts its tools for a new one (the usage "
        "memory's neighbourhood): fitted by the last refit on this registry's feedback, else "
        "SHORTLIST_LEARNING_SIMILARITY; 0.99 recalls a request's repeats only."
    )
    similarity_fitted: bool = Field(description="A refit fitted it (false: the setting applies).")
    similarity_fit: dict[str, Any] | None = Field(
        description="How it was chosen (held-out new phrasings, reciprocal rank per cosine, gain)."
    )
    companions: int = Field(0, description="Learned companion edges the last refit shipped (GET .../graph).")
    companions_fit: dict[str, Any] | None = Field(
        None, description="How they were chosen (pairs counted, proposed, refused on held-out requests)."
    )
    companion_pairs: int = Field(0, description="Ordered tool pairs counted from feedback.")
    tools_with_profile: int
    profiles: list[ToolProfile] = Field(description="Each tool's evidence (the 1000 with most).")
    tools_with_memory: int
    entries: int = Field(description="Remembered (query, tool) entries.")
    wiped_at: float | None = Field(description="Unix time of the last wipe; null if never.")
    caller_shares: list[CallerShare] = Field(description="The callers with most counted events.")


class LearningSwitch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(strict=True, description="Learn from this registry's feedback and lift its rankings.")


class ToolReport(BaseModel):
    registry: str
    learning: LearningReport | None = Field(None, description="The usage memory's state.")
    events: int = Field(description="Feedback events counted.")
    mean_trajectory_efficiency: float | None = Field(
        description="Mean over events with calls of useful calls / calls; null without calls."
    )
    prune_candidates: list[str] = Field(
        description="Tools with aggregate utility <= 0 over enough calls, or shown often and never used."
    )
    tools: list[ToolUsage]
