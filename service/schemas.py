"""Request and response bodies of the HTTP API (these become the OpenAPI schema)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

EXAMPLE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    },
    {
        "name": "convert_currency",
        "description": "Convert an amount between two currencies.",
        "input_schema": {
            "type": "object",
            "properties": {
                "amount": {"type": "number"},
                "from": {"type": "string"},
                "to": {"type": "string"},
            },
        },
    },
]

TOOLS_BODY_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": (
            "Tool JSON: a bare array or {\"tools\": [...]}. Each tool may be an OpenAI tool "
            "({type: function, function: {name, description, parameters}}), a plain function "
            "({name, description, parameters}), an Anthropic tool (input_schema) or an MCP "
            "tools/list item (inputSchema)."
        ),
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [
                        {"type": "array", "items": {"type": "object"}},
                        {
                            "type": "object",
                            "required": ["tools"],
                            "properties": {
                                "tools": {"type": "array", "items": {"type": "object"}}
                            },
                        },
                    ]
                },
                "examples": {
                    "array": {"summary": "Bare array, mixed formats", "value": EXAMPLE_TOOLS},
                    "object": {"summary": "Object form", "value": {"tools": EXAMPLE_TOOLS}},
                },
            }
        },
    }
}


class ErrorDetail(BaseModel):
    type: str = Field(examples=["validation"])
    message: str
    details: Any = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class RegistryInfoOut(BaseModel):
    registry: str = Field(examples=["payments"])
    version: int = Field(examples=[3])
    tools: int = Field(description="Number of tools in this version.", examples=[42])


class RegistryList(BaseModel):
    registries: list[RegistryInfoOut]


class RegistryOut(BaseModel):
    registry: str
    version: int
    tools: list[dict[str, Any]] = Field(description="Tool definitions exactly as uploaded.")
    equivalents: list[list[str]] = Field(
        default_factory=list, description="Groups of tools that can do the same job."
    )


class ToolUsage(BaseModel):
    name: str
    shown: int = Field(description="Feedback events whose shortlist showed this tool.")
    used: int = Field(description="Feedback events that reported this tool as used.")
    useful_calls: int
    useless_calls: int
    aggregate_utility: int = Field(description="useful_calls - useless_calls (sum of signs).")
    efficiency: float | None = Field(description="useful_calls / calls; null without calls.")


class ToolReport(BaseModel):
    registry: str
    events: int = Field(description="Feedback events counted.")
    mean_trajectory_efficiency: float | None = Field(
        description="Mean over events with calls of useful calls / calls; null without calls."
    )
    prune_candidates: list[str] = Field(
        description="Tools with aggregate utility <= 0 over enough calls, or shown often and never used."
    )
    tools: list[ToolUsage]


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str = Field(description="Name of the tool the agent called.")
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
    used: list[str] = Field(description="Tools the agent actually needed or called.")
    success: bool | None = Field(None, description="Did the agent complete the task?")
    calls: list[ToolCallIn] | None = Field(
        None, description="Each tool call of the trajectory with whether it helped."
    )


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


class ShortlistRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"registry": "demo", "query": "what's the weather in Paris tomorrow?"},
                {"registry": "demo", "query": "convert 20 euros to yen", "k": 5},
            ]
        },
    )

    registry: str = Field(description="Registry to search.", min_length=1, max_length=128)
    query: str = Field(description="The user's request or the agent's current step.")
    k: int | None = Field(
        None, description="Force a fixed depth (1..1000); the policy is then 'fixed'."
    )
    max_k: int | None = Field(None, description="Cap on the policy's depth (1..1000, default 20).")
    policy: str | None = Field(None, description="bor (default), fixed, gap or threshold.")
    scorer: str | None = Field(None, description="hybrid (default), dense or bm25.")


class ShortlistTool(BaseModel):
    name: str
    rank: int = Field(description="1-based rank under the scorer.")
    score: float
    definition: dict[str, Any] = Field(description="The tool definition as uploaded.")


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
    tools: list[ShortlistTool]


class Health(BaseModel):
    status: str = Field(examples=["ok"])
