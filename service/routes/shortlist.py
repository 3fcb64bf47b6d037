"""The agent-facing route: POST /shortlist."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends

from registry.feedback import ShownShortlist
from service.deps import EngineDep, StateDep, require_json
from service.schemas import ShortlistRequest, ShortlistResponse, ShortlistTool, error_responses

router = APIRouter(tags=["shortlist"], dependencies=[Depends(require_json)])


@router.post(
    "/shortlist",
    response_model=ShortlistResponse,
    responses=error_responses(404, 413, 415, 422, 503),
)
def shortlist(body: ShortlistRequest, engine: EngineDep, state: StateDep) -> ShortlistResponse:
    """Rank a registry's tools for a query and return the shortlist the depth policy chose."""
    result = engine.shortlist(
        body.registry,
        body.query,
        k=body.k,
        max_k=body.max_k,
        policy=body.policy,
        scorer=body.scorer,
        depth_bias=body.depth_bias,
    )
    state.metrics.observe_shortlist(result)
    state.feedback.remember(
        ShownShortlist(
            shortlist_id=result.shortlist_id,
            registry=result.registry,
            version=result.version,
            n_tools=result.n_tools,
            k=result.k,
            shown=tuple(t.name for t in result.tools),
            created=time.time(),
        )
    )
    return ShortlistResponse(
        shortlist_id=result.shortlist_id,
        registry=result.registry,
        version=result.version,
        policy=result.policy,
        scorer=result.scorer,
        k=result.k,
        n_tools=result.n_tools,
        p_rand=result.p_rand,
        bor_max_bits=result.bor_max_bits,
        depth_bias=result.depth_bias,
        tools=[
            ShortlistTool(name=t.name, rank=t.rank, score=t.score, definition=t.definition)
            for t in result.tools
        ],
    )
