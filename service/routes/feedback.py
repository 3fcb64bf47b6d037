"""Agents report which tools they used: POST /feedback."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from service.deps import CallerIdDep, CoreDep, require_json
from service.schemas import FeedbackRequest, FeedbackResponse, error_responses

router = APIRouter(tags=["feedback"], dependencies=[Depends(require_json)])


@router.post(
    "/feedback",
    response_model=FeedbackResponse,
    responses=error_responses(404, 410, 413, 415, 422, 503),
)
def feedback(body: FeedbackRequest, core: CoreDep, caller: CallerIdDep) -> FeedbackResponse:
    """Record which tools the agent used for a shortlist (a resend is not counted twice)."""
    calls = [call.model_dump() for call in body.calls] if body.calls is not None else None
    result = core.feedback(body.shortlist_id, body.used, calls, body.success, caller=caller)
    return FeedbackResponse.of(result)
