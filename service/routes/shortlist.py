"""The agent-facing route: POST /shortlist."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from service import json_body
from service.deps import CallerIdDep, CoreDep, TokenScopeDep, require_json
from service.routes.console import explain_depth
from service.schemas import ShortlistRequest, ShortlistResponse, error_responses

router = APIRouter(tags=["shortlist"], dependencies=[Depends(require_json)])


@router.post(
    "/shortlist",
    response_model=ShortlistResponse,  # documents the body; it is written directly below
    responses=error_responses(403, 404, 413, 415, 422, 503),
)
def shortlist(
    body: ShortlistRequest, core: CoreDep, caller: CallerIdDep, scope: TokenScopeDep
) -> Response:
    """Rank a registry's tools for a query and return the shortlist the depth policy chose."""
    result = core.shortlist(body.to_request(), caller=caller, token_scope=scope)
    # Serialised here, not through the response model: the body is built from typed engine
    # values, and re-validating every tool definition (on a second thread hop) cost more
    # than the rest of the route.
    body_json = result.to_json()
    if body.explained() and (explained := explain_depth(result)) is not None:
        body_json["explain"] = explained
    content = json_body.dumps(body_json)
    return Response(content.encode("utf-8"), media_type="application/json")
