"""The shortlist request: one frozen value, validated once, passed whole from every face.

The HTTP route, the MCP tool, in-process callers and the benches build a :class:`ShortlistRequest`;
:meth:`ShortlistRequest.resolve` checks every field at once against the settings and fills the
defaults, giving the :class:`ResolvedRequest` the query path runs. The ranges the request is
bounded by (``MAX_K``, ``MAX_DEPTH_BIAS``) and the policy names are defined here and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

from registry.errors import ValidationFailed

__all__ = [
    "MAX_DEPTH_BIAS",
    "MAX_K",
    "POLICIES",
    "SCORERS",
    "PolicyName",
    "RequestDefaults",
    "ResolvedRequest",
    "ScorerName",
    "ShortlistRequest",
    "depth_bias_problem",
]

PolicyName = Literal["bor", "fixed", "gap", "threshold"]
POLICIES: tuple[str, ...] = get_args(PolicyName)  # the one list of policy names
ScorerName = Literal["dense", "bm25", "hybrid"]
SCORERS: tuple[str, ...] = get_args(ScorerName)  # the one list of scorer names
MAX_K = 1000  # the deepest shortlist (k or max_k) a request may ask for
MAX_DEPTH_BIAS = 10.0  # bits; beyond this every list is 1 tool or the cap


def depth_bias_problem(depth_bias: Any, k: int | None, policy: str) -> str | None:
    """What is wrong with a request's ``depth_bias`` (``None``: nothing, or none was sent)."""
    if depth_bias is None:
        return None
    number = isinstance(depth_bias, (int, float)) and not isinstance(depth_bias, bool)
    if not (number and math.isfinite(depth_bias) and abs(depth_bias) <= MAX_DEPTH_BIAS):
        return f"must be a number between {-MAX_DEPTH_BIAS:g} and {MAX_DEPTH_BIAS:g} bits, got {depth_bias!r}"
    if k is not None:
        return "tunes the 'bor' policy; it has no effect with k (a fixed depth)"
    if policy != "bor":
        return f"tunes the 'bor' policy only; this request uses {policy!r}"
    return None


class RequestDefaults(Protocol):
    """The settings a request is resolved against (:class:`registry.settings.Settings` has them)."""

    @property
    def max_query_chars(self) -> int: ...
    @property
    def default_policy(self) -> str: ...
    @property
    def default_scorer(self) -> str: ...
    @property
    def default_max_k(self) -> int: ...
    @property
    def depth_bias(self) -> float: ...


@dataclass(frozen=True, slots=True)
class ResolvedRequest:
    """A checked request with the settings' defaults filled in: what the query path runs."""

    registry: str
    query: str
    policy: str
    scorer: str
    cap: int
    k: int | None
    bias: float | None
    allow_empty: bool


@dataclass(frozen=True, slots=True)
class ShortlistRequest:
    """One shortlist request, as every face receives it.

    Attributes:
        registry: The registry to shortlist from.
        query: The agent's request (one text; several intents and long texts are handled).
        k: A fixed depth (policy ``fixed``); ``None`` lets the policy choose.
        max_k: Cap on the policy's depth (default: ``SHORTLIST_DEFAULT_MAX_K``).
        policy: One of :data:`POLICIES` (default: ``SHORTLIST_DEFAULT_POLICY``).
        scorer: One of :data:`SCORERS` (default: ``SHORTLIST_DEFAULT_SCORER``).
        depth_bias: Bits that tune the ``bor`` policy for this request (``|bias| <=
            MAX_DEPTH_BIAS``): it stops only where STOP beats CONTINUE by at least that much.
            Refused with ``k`` or another policy.
        allow_empty: The list may be empty when no tool fits (``confidence`` says how sure).
    """

    registry: str
    query: str
    k: int | None = None
    max_k: int | None = None
    policy: str | None = None
    scorer: str | None = None
    depth_bias: float | None = None
    allow_empty: bool = False

    def resolve(self, settings: RequestDefaults) -> ResolvedRequest:
        """Check every field at once and fill the defaults from ``settings``.

        Raises:
            ValidationFailed: listing every invalid field.
        """
        query, k, max_k, policy = self.query, self.k, self.max_k, self.policy
        problems = []
        if not isinstance(query, str) or not query.strip():
            problems.append({"field": "query", "message": "must not be empty"})
        elif len(query) > settings.max_query_chars:
            problems.append(
                {
                    "field": "query",
                    "message": f"is {len(query)} characters; the limit is "
                    f"{settings.max_query_chars} (SHORTLIST_MAX_QUERY_CHARS)",
                }
            )
        for field_name, value in (("k", k), ("max_k", max_k)):
            if value is not None and not 1 <= value <= MAX_K:
                problems.append(
                    {"field": field_name, "message": f"must be between 1 and {MAX_K}, got {value}"}
                )
        policy_name = policy or settings.default_policy
        scorer_name = self.scorer or settings.default_scorer
        if policy_name not in POLICIES:
            problems.append(
                {"field": "policy", "message": f"unknown policy {policy_name!r}; use one of {list(POLICIES)}"}
            )
        if scorer_name not in SCORERS:
            problems.append(
                {"field": "scorer", "message": f"unknown scorer {scorer_name!r}; use one of {list(SCORERS)}"}
            )
        if k is not None and policy not in (None, "fixed"):
            problems.append(
                {
                    "field": "k",
                    "message": f"fixes the depth (policy 'fixed'); it cannot be combined with "
                    f"policy {policy!r}",
                }
            )
        bias_problem = depth_bias_problem(self.depth_bias, k, policy_name)
        if bias_problem:
            problems.append({"field": "depth_bias", "message": bias_problem})
        if problems:
            summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
            raise ValidationFailed(f"invalid shortlist request: {summary}", problems)
        bias = None
        if policy_name == "bor" and k is None:
            bias = settings.depth_bias if self.depth_bias is None else float(self.depth_bias)
        return ResolvedRequest(
            registry=self.registry,
            query=query,
            policy="fixed" if k is not None else policy_name,
            scorer=scorer_name,
            cap=max_k or settings.default_max_k,
            k=k,
            bias=bias,
            allow_empty=bool(self.allow_empty),
        )
