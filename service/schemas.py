"""Bodies of the agent-facing routes (shortlist, feedback, health) and the error body, shared by
every route (these become the OpenAPI schema). The admin routes' bodies: :mod:`service.schemas_admin`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

from registry import feedback, request
from registry.core import FeedbackResult
from registry.feedback import MAX_CALLS
from registry.index.hybrid import SCORERS
from registry.serving.depth_policies import POLICIES
from service.schemas_openapi import (
    MAX_TOOL_NAME_CHARS,
    ONE_OF_QUERY_OR_QUERIES,
    SHORTLIST_KNOB_RULES,
)

MAX_USED_TOOLS = 1000
"""Most tools one feedback event may name as used."""

ToolName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TOOL_NAME_CHARS)]

# The enums of the request's ``choices`` fields: the names the implementations give themselves
# (registry.index.hybrid, registry.serving.depth_policies); another name is refused by pydantic.
CHOICES: dict[str, tuple[str, ...]] = {"policies": POLICIES, "scorers": tuple(SCORERS)}
if TYPE_CHECKING:
    PolicyName = str
    ScorerName = str
else:
    PolicyName = Literal[POLICIES]
    ScorerName = Literal[tuple(SCORERS)]


class ErrorDetail(BaseModel):
    type: str = Field(examples=["validation"])
    message: str
    details: Any = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


ERROR_DESCRIPTIONS: dict[int, str] = {
    401: "Missing, malformed or unknown bearer token",
    403: "The token's bound tool patterns match no tool of this registry",
    404: "Unknown registry, tool or shortlist",
    409: "Another replica kept winning the race to write this registry; retry",
    410: "The shortlist was served before a restart or a store wipe lost its record",
    413: "Body larger than SHORTLIST_MAX_BODY_BYTES, or too many tools",
    415: "Body is not JSON: send Content-Type: application/json",
    422: "Invalid input; details name every problem",
    429: "Too many background jobs queued on this replica; retry after Retry-After seconds",
    503: "Not ready yet (still loading), or storage unavailable",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error statuses a route can return, all ``ErrorResponse``."""
    responses: dict[int | str, dict[str, Any]] = {
        status: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[status]}
        for status in statuses
    }
    if 429 in responses:
        responses[429]["headers"] = {
            "Retry-After": {"description": "Seconds to wait.", "schema": {"type": "integer"}}
        }
    if 401 in responses:
        responses[401]["headers"] = {
            "WWW-Authenticate": {
                "description": "The bearer challenge (RFC 6750).",
                "schema": {"type": "string"},
            }
        }
    return responses


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: ToolName = Field(description="Name of the tool the agent called.")
    useful: bool = Field(description="Did this call move the task forward?")


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "shortlist_id": "5c0e6f3a9b2d4e7f8a1b2c3d4e5f6a7b",
                    "used": ["get_weather"],
                    "success": True,
                    "calls": [{"tool": "get_weather", "useful": True}],
                }
            ]
        },
    )

    shortlist_id: str = Field(min_length=1, max_length=128)
    used: list[ToolName] = Field(
        description="Tools the agent actually needed or called.",
        min_length=1,
        max_length=MAX_USED_TOOLS,
    )
    success: bool | None = Field(None, description="Did the agent complete the task?")
    calls: list[ToolCallIn] | None = Field(
        None,
        description="Each tool call of the trajectory with whether it helped.",
        max_length=MAX_CALLS,
    )

    def to_request(self) -> feedback.FeedbackRequest:
        """The domain's feedback request, passed whole to the core."""
        calls = [call.model_dump() for call in self.calls] if self.calls is not None else None
        return feedback.FeedbackRequest(self.shortlist_id, tuple(self.used), calls, self.success)


class MatchFlags(BaseModel):
    exact: bool
    equivalent: bool


class MatchValues(BaseModel):
    exact: float
    equivalent: float


class FeedbackResponse(BaseModel):
    shortlist_id: str
    registry: str
    duplicate: bool = Field(description="True on a resend: nothing was counted again.")
    presented: MatchFlags = Field(description="Was a used tool (or an equivalent) in the shortlist?")
    p_rand: MatchValues = Field(description="Chance a random list of the same length would have been.")

    @classmethod
    def of(cls, result: FeedbackResult) -> FeedbackResponse:
        """The response for what :meth:`registry.core.Shortlister.feedback` recorded."""
        event = result.event
        return cls(
            shortlist_id=event.shortlist_id,
            registry=event.registry,
            duplicate=result.duplicate,
            presented=MatchFlags(exact=event.presented_exact, equivalent=event.presented_equivalent),
            p_rand=MatchValues(exact=event.p_rand_exact, equivalent=event.p_rand_equivalent),
        )


class RequestFields(BaseModel):
    """A face's request arguments (HTTP body, MCP tool): built by :func:`request_model` from
    the fields :mod:`registry.request` declares, so the faces share each field's type, bounds
    and doc."""


_UNSET: Any = object()


def request_field(name: str, *, default: Any = _UNSET, doc: str | None = None) -> tuple[Any, Any]:
    """``(annotation, Field)`` of the request field ``name`` as :mod:`registry.request`
    declares it; ``default`` replaces its default (``None`` makes a required field optional),
    ``doc`` its description (a face's alias of a field)."""
    face, declared = request.face_fields()[name]
    annotation = face.annotation
    if face.choices is not None:  # the runner's names, as an enum
        annotation = Literal[CHOICES[face.choices]] | None
    value = declared if default is _UNSET else default
    if value is None and declared is ...:
        annotation = annotation | None
    return annotation, Field(value, description=doc or face.doc, **face.bounds)


def request_model(
    name: str, base: type[RequestFields], fields: Iterable[str], **extra: tuple[Any, Any]
) -> type[RequestFields]:
    """A pydantic model of the request ``fields`` (in their declared order), then ``extra``."""
    definitions: dict[str, Any] = {field_name: request_field(field_name) for field_name in fields}
    definitions.update(extra)
    return create_model(name, __base__=base, **definitions)


def request_value(fields: dict[str, Any]) -> request.ShortlistRequest:
    """The domain's request from a face's validated fields (its lists as tuples: a frozen value)."""
    for name in ("queries", "allowed_tools"):
        if fields.get(name) is not None:
            fields[name] = tuple(fields[name])
    return request.ShortlistRequest(**fields)


class ShortlistBody(RequestFields):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"registry": "demo", "query": "what's the weather in Paris tomorrow?"},
                {"registry": "demo", "query": "convert 20 euros to yen", "k": 5},
                {"registry": "demo", "query": "book a table for two tonight", "depth_bias": 0.25},
            ],
            "allOf": SHORTLIST_KNOB_RULES,
            "oneOf": ONE_OF_QUERY_OR_QUERIES,
        },
    )

    def to_request(self) -> request.ShortlistRequest:
        """The domain's request value (``explain`` stays here: it shapes the HTTP response only)."""
        return request_value(self.model_dump(exclude={"explain"}))

    def explained(self) -> bool:
        """The caller asked for ``explain`` (how the depth was chosen)."""
        return bool(self.model_dump(include={"explain"})["explain"])


_EXPLAIN = (
    bool,
    Field(
        False,
        strict=True,  # true or false, not 0 or "yes"
        description="Also return 'explain': the bor policy's STOP - CONTINUE margin at each "
        "depth of the request's own ranking, the bias it stopped against and the depth chosen.",
    ),
)
# The POST /shortlist body: every request field, then explain (this face's own).
if TYPE_CHECKING:
    ShortlistRequest = ShortlistBody
else:
    ShortlistRequest = request_model(
        "ShortlistRequest", ShortlistBody, request.face_fields(), explain=_EXPLAIN
    )


class DepthExplanation(BaseModel):
    """How the learned policy chose the depth of the request's own ranking (``explain``)."""

    margins: list[float] = Field(
        description="Q_stop - Q_continue (bits) at depths 1, 2, ... of the request's own ranking."
    )
    bias: float = Field(
        description="What a margin must reach to stop: depth_bias plus the registry's stop-rule offset."
    )
    chosen: int = Field(description="Depth the policy chose for the request's own ranking.")
    shown: int = Field(description="Depth served for it: chosen, or deeper when exploring.")


class ShortlistTool(BaseModel):
    name: str
    rank: int = Field(description="1-based rank under the scorer.")
    score: float
    definition: dict[str, Any] = Field(description="The tool definition as uploaded.")
    alternates: list[str] = Field(
        default_factory=list,
        description="Near-duplicates of this tool (declared equivalents or near-identical "
        "descriptions) folded into its slot; names only.",
    )
    intent: int | None = Field(
        None, description="Index into 'intents' of the intent this tool covers; null: the whole request."
    )
    named: bool = Field(False, description="The request names this tool verbatim.")
    queries: list[int] | None = Field(
        None,
        description="With queries: the indices of the requests whose lists hold this tool; "
        "absent for a single query.",
    )
    reason: str | None = Field(
        None,
        description="Why a tool the ranking did not place is here: a prerequisite of a shown "
        "tool (it yields what that tool needs), or the next step after a called tool; null otherwise.",
    )


class ShortlistResponse(BaseModel):
    shortlist_id: str = Field(description="Quote this id when reporting feedback.")
    registry: str
    version: int
    policy: str
    scorer: str
    k: int = Field(description="Number of tools shown; always len(tools).")
    n_tools: int = Field(description="Registry size N.")
    p_rand: float = Field(description="Chance that k random tools include the one needed (k/N).")
    bor_max_bits: float = Field(description="Bits over random if the shortlist holds the tool.")
    depth_bias: float | None = Field(
        None, description="The bor policy's operating knob used (bits); null for other policies."
    )
    intents: list[str] = Field(
        default_factory=list,
        description="The intents the request was split into, when it held several; empty otherwise.",
    )
    confidence: float | None = Field(
        None,
        description="With allow_empty: the calibrated chance that some tool fits (the list is "
        "empty below the model's threshold); null otherwise.",
    )
    policy_version: str = Field(
        "",
        description="The depth policy version that served this list: 'default' or the "
        "registry's refit ('refit-3') for the bor policy, else the policy name ('fixed', 'gap').",
        examples=["default"],
    )
    explain: DepthExplanation | None = Field(
        None, description="With explain and the bor policy: how the depth was chosen; absent otherwise."
    )
    tools: list[ShortlistTool]


class Health(BaseModel):
    status: str = Field(examples=["ok"])


class Readiness(Health):
    warnings: list[str] = Field(
        default_factory=list,
        description="What is served around damage, e.g. a registry whose newest version file is unreadable.",
    )
