"""The agent-facing route: POST /shortlist."""

from __future__ import annotations

from fastapi import APIRouter

from service.deps import EngineDep, MetricsDep
from service.routes.registries import ERRORS
from service.schemas import ShortlistRequest, ShortlistResponse, ShortlistTool

router = APIRouter(tags=["shortlist"])


@router.post("/shortlist", response_model=ShortlistResponse, responses=ERRORS)
def shortlist(body: ShortlistRequest, engine: EngineDep, metrics: MetricsDep) -> ShortlistResponse:
    """Rank a registry's tools for a query and return the shortlist the depth policy chose."""
    result = engine.shortlist(
        body.registry,
        body.query,
        k=body.k,
        max_k=body.max_k,
        policy=body.policy,
        scorer=body.scorer,
    )
    metrics.observe_shortlist(result)
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
        tools=[
            ShortlistTool(name=t.name, rank=t.rank, score=t.score, definition=t.definition)
            for t in result.tools
        ],
    )
