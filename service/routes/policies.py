"""Per-registry depth policies: list versions, refit from feedback, activate (roll back).

``GET /registries/{r}/policies`` needs a read token; refits and activation an admin token
(create_app guards each router). A refit runs on a worker thread, never a query's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from registry.errors import ValidationFailed
from registry.learning.manager import WAIT_SECONDS, RefitJob
from service.deps import CoreDep, require_json
from service.routes.registries import RegistryPath
from service.schemas import error_responses

router = APIRouter(prefix="/registries", tags=["policies"])
# Refit and activate take no body, yet must say JSON like every write: a cross-site form POST
# (text/plain, no preflight) must not start a refit or roll a policy back.
admin_router = APIRouter(prefix="/registries", tags=["policies"], dependencies=[Depends(require_json)])


class PolicyVersionOut(BaseModel):
    version: str = Field(examples=["refit-2"])
    kind: str = Field(description="'bias' (offset on the network's STOP - CONTINUE margin) or "
                      "'calibrated' (logistic miss probability, stops at a threshold).")
    active: bool
    bias_offset: float = 0.0
    max_depth: int | None = None
    threshold: float | None = None
    created: float | None = None
    parent: str | None = None
    estimate: dict[str, Any] = Field(default_factory=dict, description="The refit's held-out "
                                     "estimate: found, mean K, efficiency of candidate and current.")


class PolicyList(BaseModel):
    registry: str
    active: str = Field(description="The version stored as active (every replica converges to it).")
    serving: str = Field(description="The version this replica serves now.")
    versions: list[PolicyVersionOut]


class RefitJobOut(BaseModel):
    job: str
    registry: str
    state: str = Field(description="queued, running, done (a new version is active), candidate "
                       "(a new version is stored, not active: it changes mean K past "
                       "SHORTLIST_REFIT_REVIEW_FACTOR; activate it by hand), refused (the guard "
                       "said no) or failed. The estimate's 'profile' says what the usage-profile "
                       "weight fit (its first step) concluded.")
    reason: str = ""
    version: str | None = Field(None, description="The version a done refit activated (a "
                                "candidate refit stored).")
    active: str | None = None
    estimate: dict[str, Any] = Field(default_factory=dict)
    created: float | None = None
    finished: float | None = None


def _listing(data: dict[str, Any]) -> PolicyList:
    versions = []
    for v in data["versions"]:
        calibrated = v.get("kind") == "calibrated"
        versions.append(
            PolicyVersionOut(
                version=v["version"], kind=v.get("kind", "bias"), active=v["active"],
                bias_offset=v.get("bias_offset", 0.0), max_depth=v.get("max_depth"),
                threshold=v.get("threshold") if calibrated else None, created=v.get("created"),
                parent=v.get("parent"), estimate=v.get("estimate") or {},
            )
        )
    return PolicyList(
        registry=data["registry"], active=data["active"], serving=data["serving"], versions=versions
    )


@router.get(
    "/{registry}/policies", response_model=PolicyList, responses=error_responses(404, 422, 503)
)
def list_policies(registry: RegistryPath, core: CoreDep) -> PolicyList:
    """Every version of the registry's depth policy, the active one and the one served here."""
    core.snapshot(registry)  # 404 for an unknown registry
    return _listing(core.policies.listing(registry))


@admin_router.post(
    "/{registry}/policies/refit",
    response_model=RefitJobOut,
    responses={202: {"description": "Queued (async=true): poll the job."},
               **error_responses(404, 415, 422, 429, 503)},
)
async def refit(
    registry: RegistryPath,
    core: CoreDep,
    request: Request,
    run_async: Annotated[bool, Query(alias="async", description="Answer at once with the job "
                                     "id; poll GET .../refit/{job} until its state is final.")] = False,
) -> Any:
    """Refit the registry's depth policy from its feedback; activate it only when it beats the
    current one on held-out feedback (bootstrap lower bound above the margin, found rate kept).
    Refits are queued and run one at a time per replica; a full queue answers 429."""
    unknown = sorted(set(request.query_params) - {"async"})
    if unknown:  # a misspelt 'async' must not silently run a synchronous refit
        problems = [{"field": name[:100], "message": "unknown query parameter"} for name in unknown]
        raise ValidationFailed(f"unknown query parameter(s): {unknown[:5]}", problems)
    core.snapshot(registry)
    job = await run_in_threadpool(core.policies.refit, registry, background=True)
    if run_async:
        return JSONResponse({"job": job.job, "state": job.state}, status_code=202)
    deadline = time.monotonic() + WAIT_SECONDS
    while job.state in ("queued", "running") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # waits on the event loop, holding no worker thread
        job = await _job_now(core, job)
    return RefitJobOut.model_validate(job.to_json())


async def _job_now(core: Any, job: RefitJob) -> RefitJob:
    found: RefitJob = await run_in_threadpool(core.policies.job, job.registry, job.job)
    return found


@admin_router.get(
    "/{registry}/policies/refit/{job}",
    response_model=RefitJobOut,
    responses=error_responses(404, 422, 503),
)
def refit_job(
    registry: RegistryPath, job: Annotated[str, Path(max_length=64)], core: CoreDep
) -> RefitJobOut:
    """A refit job's state: queued, running, done, refused or failed (kept a day, and after a
    restart: an interrupted job runs again)."""
    return RefitJobOut.model_validate(core.policies.job(registry, job).to_json())


@admin_router.post(
    "/{registry}/policies/{version}/activate",
    response_model=PolicyList,
    responses=error_responses(404, 415, 422, 503),
)
def activate(
    registry: RegistryPath, version: Annotated[str, Path(max_length=64)], core: CoreDep
) -> PolicyList:
    """Make a stored version (or 'default') active on every replica: a rollback or roll-forward."""
    core.snapshot(registry)
    return _listing(core.policies.activate(registry, version))
