"""Agents report which tools they used: POST /feedback."""

from __future__ import annotations

from collections.abc import Collection

from fastapi import APIRouter, Depends

from registry.feedback import EquivalenceClasses
from service.deps import EngineDep, StateDep, require_json
from service.schemas import (
    FeedbackRequest,
    FeedbackResponse,
    MatchFlags,
    MatchValues,
    error_responses,
)

router = APIRouter(tags=["feedback"], dependencies=[Depends(require_json)])


@router.post(
    "/feedback",
    response_model=FeedbackResponse,
    responses=error_responses(404, 413, 415, 422, 503),
)
def feedback(body: FeedbackRequest, engine: EngineDep, state: StateDep) -> FeedbackResponse:
    """Record which tools the agent used for a shortlist (a resend is not counted twice)."""

    def known_tools(registry: str) -> Collection[str]:
        snap = engine.current(registry)
        return snap.by_name if snap else ()

    def equivalence(registry: str) -> EquivalenceClasses:
        snap = engine.current(registry)
        return snap.equivalence if snap else EquivalenceClasses()

    calls = [call.model_dump() for call in body.calls] if body.calls is not None else None
    event, resent = state.feedback.submit(
        body.shortlist_id,
        body.used,
        calls,
        body.success,
        known_tools=known_tools,
        equivalence=equivalence,
    )
    return FeedbackResponse(
        shortlist_id=event.shortlist_id,
        registry=event.registry,
        duplicate=resent,
        presented=MatchFlags(exact=event.presented_exact, equivalent=event.presented_equivalent),
        p_rand=MatchValues(exact=event.p_rand_exact, equivalent=event.p_rand_equivalent),
    )
