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
    return FeedbackResponse.of(core.feedback(body.to_request(), caller=caller))
