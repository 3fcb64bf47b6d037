"""The shortlist request: one frozen value, validated once, passed whole from every face.

Each field is declared once, here: its type, default, bounds and doc (:class:`FaceField`, read by
:func:`face_fields`); the HTTP body (``service/schemas.py``) and the MCP tool's arguments
(``service/mcp.py``) are built from those declarations, so the faces cannot drift.
The HTTP route, the MCP tool, in-process callers and the benches build a :class:`ShortlistRequest`;
:meth:`ShortlistRequest.resolve` checks every field at once against the settings and fills the
defaults, giving the :class:`ResolvedRequest` the query path runs. The ranges the request is
bounded by (``MAX_K``, ``MAX_DEPTH_BIAS``) are defined here and nowhere else. The scorer and
depth-policy names a request may give are the ones the query runner offers (:class:`Choices`:
each implementation names itself, :data:`registry.index.hybrid.SCORERS`,
:data:`registry.serving.depth_policies.POLICIES`); the request's own rules speak of two of
them, :data:`LEARNED_POLICY` and :data:`FIXED_POLICY`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Annotated, Any, Protocol

from pydantic import Field, StringConstraints

from registry.errors import ValidationFailed
from registry.name_checks import MAX_REGISTRY_NAME_CHARS, REGISTRY_NAME_PATTERN

__all__ = [
    "FIXED_POLICY",
    "LEARNED_POLICY",
    "MAX_ALLOWED_TOOLS",
    "MAX_CALLED",
    "MAX_DEPTH_BIAS",
    "MAX_K",
    "MAX_QUERIES",
    "NOT_BLANK_PATTERN",
    "Choices",
    "FaceField",
    "RequestDefaults",
    "ResolvedRequest",
    "ShortlistRequest",
    "depth_bias_problem",
    "face_fields",
]

LEARNED_POLICY = "bor"  # the learned policy: the one ``depth_bias`` tunes
FIXED_POLICY = "fixed"  # the policy ``k`` implies
MAX_K = 1000  # the deepest shortlist (k or max_k) a request may ask for
MAX_DEPTH_BIAS = 10.0  # bits; beyond this every list is 1 tool or the cap
MAX_QUERIES = 16  # requests in one call (``queries``)
MAX_ALLOWED_TOOLS = 10_000  # names or patterns in ``allowed_tools`` (an agent's whole toolbox)
MAX_PATTERN_CHARS = 256  # one ``allowed_tools`` entry: a tool name's length (registry.tools)
MAX_CALLED = 100  # tool names a request may list as already called


def _not_blank_pattern() -> str:
    """A pattern that finds a character ``str.strip()`` keeps: the query validation's "not blank"."""
    spaces = "".join(f"\\u{ord(c):04x}" for c in map(chr, range(0x3001)) if c.isspace())
    return f"[^{spaces}]"


NOT_BLANK_PATTERN = _not_blank_pattern()
# blank and too long are refused by resolve (naming the entry); the pattern documents it
_QueryText = Annotated[str, Field(min_length=1, json_schema_extra={"pattern": NOT_BLANK_PATTERN})]
_AllowedTool = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATTERN_CHARS)]
RegistryName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_REGISTRY_NAME_CHARS, pattern=REGISTRY_NAME_PATTERN)
]


@dataclass(frozen=True, slots=True)
class FaceField:
    """A request field as the faces declare it: the type they validate (``choices``: one of the
    runner's ``scorers`` or ``policies``, which the face turns into an enum), its doc, and the
    bounds their schemas carry (pydantic ``Field`` keywords). ``resolve`` checks the same
    bounds again, so an in-process request is held to them too."""

    annotation: Any
    doc: str
    bounds: Mapping[str, Any] = field(default_factory=dict)
    choices: str | None = None


def _face(annotation: Any, doc: str, *, choices: str | None = None, **bounds: Any) -> dict[str, FaceField]:
    return {"face": FaceField(annotation, doc, bounds, choices)}


def face_fields() -> dict[str, tuple[FaceField, Any]]:
    """Every request field's declaration and default (``...``: required), in order."""
    return {
        f.name: (f.metadata["face"], ... if f.default is MISSING else f.default)
        for f in fields(ShortlistRequest)
    }


def depth_bias_problem(depth_bias: Any, k: int | None, policy: str) -> str | None:
    """What is wrong with a request's ``depth_bias`` (``None``: nothing, or none was sent)."""
    if depth_bias is None:
        return None
    number = isinstance(depth_bias, (int, float)) and not isinstance(depth_bias, bool)
    if not (number and math.isfinite(depth_bias) and abs(depth_bias) <= MAX_DEPTH_BIAS):
        return f"must be a number between {-MAX_DEPTH_BIAS:g} and {MAX_DEPTH_BIAS:g} bits, got {depth_bias!r}"
    if k is not None:
        return "tunes the 'bor' policy; it has no effect with k (a fixed depth)"
    if policy != LEARNED_POLICY:
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


class Choices(Protocol):
    """The scorer and depth-policy names a request may give: what the query runner offers
    (:class:`registry.serving.shortlist.QueryRunner` is one)."""

    @property
    def scorers(self) -> Collection[str]: ...
    @property
    def policies(self) -> Collection[str]: ...


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
    # None unless the request (or its token) uses them: the one-query, whole-registry path
    # reads nothing else (registry.serving.scope, registry.serving.batch)
    queries: tuple[str, ...] | None = None
    allowed_tools: tuple[str, ...] | None = None
    token_scope: tuple[str, ...] | None = None
    called: tuple[str, ...] = ()  # checked against the registry's tools by the query path

    @property
    def scoped(self) -> bool:
        """The request may see only some of the registry's tools."""
        return self.allowed_tools is not None or self.token_scope is not None


@dataclass(frozen=True, slots=True)
class ShortlistRequest:
    """One shortlist request, as every face receives it.

    Each field's doc, bounds and type on the wire are declared with it (:class:`FaceField`):
    the faces' schemas are built from them and :meth:`resolve` checks them. ``queries`` are
    answered on one snapshot and merged (:mod:`registry.serving.batch`); ``allowed_tools``
    scope the ranking (:mod:`registry.serving.scope`); ``called`` moves the list on to the
    next steps (:mod:`registry.serving.chains`).
    """

    registry: str = field(metadata=_face(RegistryName, "Registry to search."))
    query: str | None = field(
        default=None,
        metadata=_face(
            str | None,
            "The user's request (a whole message is fine) or the agent's current step; "
            "not blank, at most SHORTLIST_MAX_QUERY_CHARS (default 262144) characters. Several "
            "intents ('find X, then email it') are each covered; a tool named verbatim comes first. "
            "Exactly one of query and queries.",
            min_length=1,
            # documented only: resolve refuses blank and too long texts with clearer messages;
            # maxLength is the setting's value (service.schemas_openapi.document_settings)
            json_schema_extra={"pattern": NOT_BLANK_PATTERN},
        ),
    )
    k: int | None = field(
        default=None,
        metadata=_face(
            int | None,
            "Force a fixed depth; the policy is then 'fixed' (refused with another policy).",
            ge=1, le=MAX_K, strict=True,  # an integer, not true or "5"
        ),
    )  # fmt: skip
    max_k: int | None = field(
        default=None,
        metadata=_face(int | None, "Cap on the policy's depth (default 20).", ge=1, le=MAX_K, strict=True),
    )
    policy: str | None = field(default=None, metadata=_face(str | None, "Depth policy; default bor.", choices="policies"))
    scorer: str | None = field(default=None, metadata=_face(str | None, "Scorer; default hybrid.", choices="scorers"))
    depth_bias: float | None = field(
        default=None,
        metadata=_face(
            float | None,
            "Operating knob of the 'bor' policy, in bits: stop only where STOP beats "
            "CONTINUE by at least this much. > 0 gives longer lists (more often holds the tool), "
            "< 0 shorter ones; default SHORTLIST_DEPTH_BIAS (0). Refused with k or another policy.",
            ge=-MAX_DEPTH_BIAS, le=MAX_DEPTH_BIAS, allow_inf_nan=False,
            strict=True,  # a number, not false or "0.5" (the fuzz test's ST201)
        ),
    )  # fmt: skip
    allow_empty: bool = field(
        default=False,
        metadata=_face(
            bool,
            "Allow an empty shortlist (k = 0) when no tool fits the request; the "
            "response's confidence says how sure the service is that one does.",
            strict=True,  # true or false, not 0 or "yes" (the fuzz test's ST201)
        ),
    )
    queries: Sequence[str] | None = field(
        default=None,
        metadata=_face(
            list[_QueryText] | None,
            f"Up to {MAX_QUERIES} requests in one call, instead of query: one shortlist "
            "holding each request's own list (k, max_k and the depth apply to each), merged "
            "round-robin without duplicates; each tool's 'queries' lists the requests that brought "
            "it. One shortlist_id for feedback.",
            min_length=1, max_length=MAX_QUERIES,
        ),
    )  # fmt: skip
    allowed_tools: Sequence[str] | None = field(
        default=None,
        metadata=_face(
            list[_AllowedTool] | None,
            "Tool names or glob patterns ('github/*', 'fs/read_*'; * ? [abc]): ranking, "
            "depth and max_k see only the tools they match, never the others. A pattern matching no "
            "tool is refused. A token bound to patterns (SHORTLIST_QUERY_TOKEN_SCOPES) is narrowed "
            "by them, never widened.",
            min_length=1, max_length=MAX_ALLOWED_TOOLS,
        ),
    )  # fmt: skip
    called: tuple[str, ...] = field(
        default=(),
        metadata=_face(
            tuple[str, ...],
            "Tool names the agent already called in this task, oldest first: they leave "
            "the list (the agent holds them) and the tools they are a prerequisite of come first. "
            "Every name must be a tool of the registry (an unknown name is refused, naming it).",
            max_length=MAX_CALLED,
        ),
    )

    def resolve(
        self, settings: RequestDefaults, choices: Choices, token_scope: Sequence[str] | None = None
    ) -> ResolvedRequest:
        """Check every field at once and fill the defaults from ``settings``.

        Args:
            settings: Where the defaults and the query length limit come from.
            choices: The scorer and policy names the runner offers.
            token_scope: The patterns an admin bound to the caller's token (None: unbound); the
                request's ``allowed_tools`` can only narrow them.

        Raises:
            ValidationFailed: listing every invalid field.
        """
        query, k, max_k, policy = self.query, self.k, self.max_k, self.policy
        problems: list[dict[str, Any]] = []
        queries = None
        if self.queries is None and query is None:
            problems.append({"field": "query", "message": "is required: give query (one request) or queries"})
        elif self.queries is None:
            problems += _text_problems("query", query, settings.max_query_chars)
        else:
            if query is not None:
                problems.append({"field": "query", "message": "give query or queries, not both"})
            queries = _queries(self.queries, settings.max_query_chars, problems)
        allowed = None if self.allowed_tools is None else _patterns(self.allowed_tools, problems)
        for field_name, value in (("k", k), ("max_k", max_k)):
            if value is not None and not 1 <= value <= MAX_K:
                problems.append(
                    {"field": field_name, "message": f"must be between 1 and {MAX_K}, got {value}"}
                )
        policy_name = policy or settings.default_policy
        scorer_name = self.scorer or settings.default_scorer
        if policy_name not in choices.policies:
            problems.append(
                {"field": "policy", "message": f"unknown policy {policy_name!r}; use one of {list(choices.policies)}"}
            )
        if scorer_name not in choices.scorers:
            problems.append(
                {"field": "scorer", "message": f"unknown scorer {scorer_name!r}; use one of {list(choices.scorers)}"}
            )
        if k is not None and policy not in (None, FIXED_POLICY):
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
        called = self.called
        if not isinstance(called, (list, tuple)) or not all(isinstance(c, str) for c in called):
            problems.append({"field": "called", "message": "must be a list of tool names"})
        elif len(called) > MAX_CALLED:
            problems.append(
                {"field": "called", "message": f"lists {len(called)} names; the limit is {MAX_CALLED}"}
            )
        if problems:
            summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
            raise ValidationFailed(f"invalid shortlist request: {summary}", problems)
        bias = None
        if policy_name == LEARNED_POLICY and k is None:
            bias = settings.depth_bias if self.depth_bias is None else float(self.depth_bias)
        return ResolvedRequest(
            registry=self.registry,
            query=query or "",
            policy=FIXED_POLICY if k is not None else policy_name,
            scorer=scorer_name,
            cap=max_k or settings.default_max_k,
            k=k,
            bias=bias,
            allow_empty=bool(self.allow_empty),
            queries=queries,
            allowed_tools=allowed,
            token_scope=tuple(token_scope) if token_scope is not None else None,
            called=tuple(called),
        )


def _text_problems(field: str, text: Any, limit: int) -> list[dict[str, Any]]:
    """What is wrong with one request text (``query``, or an entry of ``queries``)."""
    if not isinstance(text, str) or not text.strip():
        return [{"field": field, "message": "must not be empty"}]
    if len(text) > limit:
        return [
            {
                "field": field,
                "message": f"is {len(text)} characters; the limit is {limit} "
                "(SHORTLIST_MAX_QUERY_CHARS)",
            }
        ]
    return []


def _queries(value: Any, limit: int, problems: list[dict[str, Any]]) -> tuple[str, ...] | None:
    """``queries`` as a tuple, or None after adding its problems."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        problems.append({"field": "queries", "message": "must be a list of request texts"})
        return None
    if not 1 <= len(value) <= MAX_QUERIES:
        problems.append(
            {"field": "queries", "message": f"must hold 1 to {MAX_QUERIES} requests, got {len(value)}"}
        )
        return None
    found = [p for i, text in enumerate(value) for p in _text_problems(f"queries[{i}]", text, limit)]
    problems += found
    return None if found else tuple(value)


def _patterns(value: Any, problems: list[dict[str, Any]]) -> tuple[str, ...] | None:
    """``allowed_tools`` as a tuple of distinct patterns, or None after adding its problems."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        problems.append({"field": "allowed_tools", "message": "must be a list of tool names or patterns"})
        return None
    if not 1 <= len(value) <= MAX_ALLOWED_TOOLS:
        problems.append(
            {
                "field": "allowed_tools",
                "message": f"must hold 1 to {MAX_ALLOWED_TOOLS} names or patterns, got {len(value)} "
                "(leave it out to allow every tool)",
            }
        )
        return None
    bad = [
        i for i, p in enumerate(value)
        if not isinstance(p, str) or not p.strip() or len(p) > MAX_PATTERN_CHARS
    ]  # fmt: skip
    for i in bad[:10]:
        problems.append(
            {"field": f"allowed_tools[{i}]", "message": f"must be a tool name or pattern of 1 to {MAX_PATTERN_CHARS} characters"}
        )
    return None if bad else tuple(dict.fromkeys(value))
