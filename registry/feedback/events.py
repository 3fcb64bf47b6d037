"""Equivalent tools and feedback events: what an agent reports, validated (served shortlists:
:mod:`registry.feedback.served`)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from registry.bor import p_rand
from registry.errors import ValidationFailed
from registry.feedback.equivalents import EquivalenceClasses
from registry.feedback.served import (  # re-exported: they lived here first
    MAX_LOGGED_QUERY_CHARS,
    RANKING_TAIL,
    RememberedShortlists,
    ServedTrace,
    ShortlistMemory,
    ShownShortlist,
)

#: The two ways a shortlist can be credited with presenting a used tool.
MATCHES: tuple[str, str] = ("exact", "equivalent")
#: Upper bound on the calls one feedback event may report (keeps log lines bounded).
MAX_CALLS = 10_000
#: Upper bound on the bytes those calls take as stored (``[{"tool":..,"useful":..}]`` JSON): the
#: count alone lets 10,000 long names add megabytes to the log per event.
MAX_CALLS_BYTES = 64 * 1024

__all__ = [
    "MATCHES",
    "MAX_CALLS",
    "MAX_CALLS_BYTES",
    "MAX_LOGGED_QUERY_CHARS",
    "RANKING_TAIL",
    "FeedbackEvent",
    "FeedbackRequest",
    "RememberedShortlists",
    "ShortlistMemory",
    "ShownShortlist",
    "ToolCall",
    "build_event",
    "parse_feedback",
]

# -- feedback events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FeedbackRequest:
    """One feedback report, as every face receives it (``POST /feedback``, MCP
    ``report_tool_use``, in-process callers), passed whole to
    :meth:`registry.feedback.FeedbackRecorder.submit`, which validates it once against the
    shortlist it quotes and that shortlist's registry (:func:`build_event`).

    Attributes:
        shortlist_id: The id of a served shortlist.
        used: The tools the agent needed or called (at least one).
        calls: Each call of the trajectory with whether it helped: ``{"tool", "useful"}``
            mappings or :class:`ToolCall` (None: not reported).
        success: Whether the agent completed the task (None: not reported).
    """

    shortlist_id: str
    used: Sequence[str]
    calls: Sequence[Mapping[str, Any] | ToolCall] | None = None
    success: bool | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of the agent's trajectory and the sign of its marginal utility."""

    tool: str
    useful: bool

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "useful": self.useful}


@dataclass(frozen=True, slots=True)
class FeedbackEvent(ServedTrace):
    """One accepted feedback report, joined with the shortlist it refers to: these fields, and
    the shortlist's trace (:class:`ServedTrace`, keywords; ``caller`` is who sent the feedback).

    Attributes:
        presented_exact: some used tool was shown.
        presented_equivalent: some used tool, or an equivalent of one, was shown.
        p_rand_exact: ``P_rand(N=n_tools, R=|used|, K=k)``.
        p_rand_equivalent: ``P_rand(N, R=|union of the classes of used|, K)``, ``R`` clipped
            to ``N``.
        received: wall-clock seconds when the feedback was accepted.
    """

    shortlist_id: str
    registry: str
    version: int
    n_tools: int
    k: int
    shown: tuple[str, ...]
    used: tuple[str, ...]
    success: bool | None
    calls: tuple[ToolCall, ...]
    presented_exact: bool
    presented_equivalent: bool
    p_rand_exact: float
    p_rand_equivalent: float
    received: float

    def rank_of(self, names: Collection[str]) -> int | None:
        """0-based position of the first of ``names`` in the logged ranking (the shown list
        first); ``None`` when none of them is there (ranked deeper than logged: censored)."""
        order = self.ranking or self.shown
        for position, name in enumerate(order):
            if name in names:
                return position
        return None

    def presented(self, match: str) -> bool:
        """``presented_exact`` or ``presented_equivalent`` by ``match`` name."""
        return self.presented_exact if match == "exact" else self.presented_equivalent

    def p_rand(self, match: str) -> float:
        """``p_rand_exact`` or ``p_rand_equivalent`` by ``match`` name."""
        return self.p_rand_exact if match == "exact" else self.p_rand_equivalent

    def to_json(self) -> dict[str, Any]:
        return {
            "shortlist_id": self.shortlist_id,
            "registry": self.registry,
            "version": self.version,
            "n_tools": self.n_tools,
            "k": self.k,
            "shown": list(self.shown),
            "used": list(self.used),
            "success": self.success,
            "calls": [call.to_json() for call in self.calls],
            "presented_exact": self.presented_exact,
            "presented_equivalent": self.presented_equivalent,
            "p_rand_exact": self.p_rand_exact,
            "p_rand_equivalent": self.p_rand_equivalent,
            "received": self.received,
            **self.trace_json(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FeedbackEvent:
        """Inverse of :meth:`to_json`. Raises ``KeyError``/``TypeError``/``ValueError``."""
        success = d["success"]
        if success is not None and not isinstance(success, bool):
            raise TypeError(f"success must be a bool or null, got {success!r}")
        return cls(
            shortlist_id=str(d["shortlist_id"]),
            registry=str(d["registry"]),
            version=int(d["version"]),
            n_tools=int(d["n_tools"]),
            k=int(d["k"]),
            shown=tuple(str(n) for n in d["shown"]),
            used=tuple(str(n) for n in d["used"]),
            success=success,
            calls=tuple(ToolCall(str(c["tool"]), bool(c["useful"])) for c in d["calls"]),
            presented_exact=bool(d["presented_exact"]),
            presented_equivalent=bool(d["presented_equivalent"]),
            p_rand_exact=float(d["p_rand_exact"]),
            p_rand_equivalent=float(d["p_rand_equivalent"]),
            received=float(d["received"]),
            **ServedTrace.trace_from_json(d),
        )


_Checked = tuple[
    tuple[str, ...], list[tuple[str, str]], tuple[ToolCall, ...], bool | None, list[dict[str, Any]]
]


def _check_feedback(used: Any, calls: Any, success: Any) -> _Checked:
    """Structural checks. Returns (used, [(field, name)] to look up, calls, success, problems)."""
    problems: list[dict[str, Any]] = []
    names: list[tuple[str, str]] = []
    used_out: list[str] = []
    if not isinstance(used, (list, tuple)) or isinstance(used, str):
        problems.append({"field": "used", "message": "must be a non-empty list of tool names"})
    elif not used:
        problems.append({"field": "used", "message": "must name at least one tool"})
    else:
        for i, name in enumerate(used):
            if not isinstance(name, str) or not name:
                problems.append(
                    {"field": f"used[{i}]", "message": "must be a tool name (a non-empty string)"}
                )
            else:
                names.append((f"used[{i}]", name))
                used_out.append(name)

    calls_out: list[ToolCall] = []
    if calls is None:
        pass
    elif not isinstance(calls, (list, tuple)):
        problems.append({"field": "calls", "message": "must be a list of {tool, useful} objects"})
    elif len(calls) > MAX_CALLS:
        problems.append(
            {"field": "calls", "message": f"at most {MAX_CALLS} calls per feedback event"}
        )
    else:
        for i, call in enumerate(calls):
            tool: Any
            useful: Any
            if isinstance(call, ToolCall):
                tool, useful = call.tool, call.useful
            elif isinstance(call, dict):
                tool, useful = call.get("tool"), call.get("useful")
            else:
                problems.append(
                    {"field": f"calls[{i}]", "message": "must be an object {tool, useful}"}
                )
                continue
            tool_ok = isinstance(tool, str) and bool(tool)
            if not tool_ok:
                problems.append(
                    {
                        "field": f"calls[{i}].tool",
                        "message": "must be a tool name (a non-empty string)",
                    }
                )
            if not isinstance(useful, bool):
                problems.append({"field": f"calls[{i}].useful", "message": "must be true or false"})
            elif isinstance(tool, str) and tool_ok:
                names.append((f"calls[{i}].tool", tool))
                calls_out.append(ToolCall(tool, useful))

    stored = _json_bytes([call.to_json() for call in calls_out]) if calls_out else 0
    if stored > MAX_CALLS_BYTES:
        problems.append(
            {
                "field": "calls",
                "message": f"the calls take {stored} bytes as stored, more than the limit of "
                f"{MAX_CALLS_BYTES}: report fewer calls",
            }
        )
    if success is not None and not isinstance(success, bool):
        problems.append({"field": "success", "message": "must be true, false or null"})
        success = None
    return tuple(dict.fromkeys(used_out)), names, tuple(calls_out), success, problems


def _json_bytes(value: Any) -> int:
    """Bytes of ``value`` in the log's encoding (compact JSON, ASCII escapes)."""
    return len(json.dumps(value, separators=(",", ":"), allow_nan=False))


def event_line(event: FeedbackEvent) -> bytes:
    """``event`` as one line of the feedback log (JSON Lines)."""
    return (json.dumps(event.to_json(), separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")


def check_event_size(event: FeedbackEvent, limit: int) -> None:
    """Refuse an event whose log line would exceed ``limit`` bytes, naming its largest fields.

    Raises:
        ValidationFailed: one problem per field, largest first, with its bytes.
    """
    size = len(event_line(event))
    if size <= limit:
        return
    fields = sorted(((_json_bytes(v), k) for k, v in event.to_json().items()), reverse=True)
    largest = ", ".join(f"{name} {n} bytes" for n, name in fields[:3])
    problems = [
        {"field": name, "message": f"takes {n} bytes of the {size}-byte event", "bytes": n}
        for n, name in fields[:3]
    ]
    raise ValidationFailed(
        f"the feedback event would take {size} bytes in the log, more than the limit of "
        f"{limit} (SHORTLIST_MAX_FEEDBACK_EVENT_BYTES); largest: {largest}",
        problems,
    )


def parse_feedback(
    used: Any, calls: Any = None, success: Any = None
) -> tuple[tuple[str, ...], tuple[ToolCall, ...], bool | None]:
    """Structural validation of the feedback payload fields (no registry lookup).

    Args:
        used: non-empty list of tool-name strings; duplicates are collapsed (first order kept).
        calls: ``None`` or a list of ``{"tool": str, "useful": bool}`` (or :class:`ToolCall`).
        success: ``None``, ``True`` or ``False``.

    Returns:
        ``(used, calls, success)`` typed and de-duplicated.

    Raises:
        ValidationFailed: listing every problem with fields like ``"used"``, ``"used[2]"``,
            ``"calls[0].tool"``.
    """
    used_t, _, calls_t, success_v, problems = _check_feedback(used, calls, success)
    if problems:
        raise ValidationFailed(f"invalid feedback: {len(problems)} problem(s)", problems)
    return used_t, calls_t, success_v


def build_event(
    shortlist: ShownShortlist,
    used: Any,
    calls: Any,
    success: Any,
    known_tools: Collection[str],
    equivalence: EquivalenceClasses,
    received: float,
    caller: str | None = None,
) -> FeedbackEvent:
    """Validate a feedback report against its shortlist and registry and score it.

    A name is accepted when it is a tool of the registry now (``known_tools``) or was shown
    in the shortlist (it was a tool of the registry when served, even if since deleted).

    Args:
        shortlist: the shortlist the feedback quotes.
        used, calls, success: raw payload values, as for :func:`parse_feedback`.
        known_tools: current tool names of ``shortlist.registry``.
        equivalence: the registry's equivalence classes.
        received: wall-clock seconds, stored on the event.
        caller: hash of the token that sent the feedback (``None``: no tokens configured).

    Raises:
        ValidationFailed: every structural problem and every unknown tool (``"tool"`` key in
            the problem names it), all in one list.
    """
    used_t, names, calls_t, success_v, problems = _check_feedback(used, calls, success)
    shown = set(shortlist.shown)
    if not isinstance(known_tools, (set, frozenset, dict)):
        known_tools = set(known_tools)
    for field, name in names:
        if name not in known_tools and name not in shown:
            problems.append(
                {
                    "field": field,
                    "message": f"tool {name!r} does not exist in registry {shortlist.registry!r}",
                    "tool": name,
                }
            )
    if problems:
        raise ValidationFailed(f"invalid feedback: {len(problems)} problem(s)", problems)

    relevant_equiv = equivalence.expand(used_t)
    n = max(int(shortlist.n_tools), 1)
    k = max(int(shortlist.k), 0)
    return FeedbackEvent(
        **{**shortlist.trace(), "caller": caller, "depth_chosen": shortlist.depth_chosen or shortlist.k},
        shortlist_id=shortlist.shortlist_id,
        registry=shortlist.registry,
        version=shortlist.version,
        n_tools=shortlist.n_tools,
        k=shortlist.k,
        shown=tuple(shortlist.shown),
        used=used_t,
        success=success_v,
        calls=calls_t,
        presented_exact=not shown.isdisjoint(used_t),
        presented_equivalent=not shown.isdisjoint(relevant_equiv),
        p_rand_exact=p_rand(n, min(len(used_t), n), k),
        p_rand_equivalent=p_rand(n, min(len(relevant_equiv), n), k),
        received=float(received),
    )


