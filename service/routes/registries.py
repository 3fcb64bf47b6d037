"""Registry admin routes: upload, upsert, list, read, delete."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from registry.core import Shortlister
from registry.errors import NotFound, ValidationFailed
from registry.name_checks import (
    MAX_REGISTRY_NAME_CHARS,
    REGISTRY_NAME_PATTERN,
    url_name_problem,
    validate_registry_name,
)
from registry.snapshots import RegistryInfo
from registry.writes.write_jobs import WriteJob
from service.deps import CoreDep, require_json
from service.errors import invalid_body
from service.schemas import ErrorDetail, error_responses
from service.schemas_admin import (
    GraphEditRequest,
    RegistryGraph,
    RegistryInfoOut,
    RegistryList,
    RegistryOut,
    ToolReport,
)
from service.schemas_openapi import MAX_TOOL_NAME_CHARS, TOOLS_BODY_OPENAPI

# Reads and writes are separate routers so that create_app can guard each with its own token.
router = APIRouter(prefix="/registries", tags=["registries"])
admin_router = APIRouter(
    prefix="/registries", tags=["registries"], dependencies=[Depends(require_json)]
)


async def registry_name(
    registry: Annotated[
        str,
        Path(
            description="Registry name: 1-128 of A-Z a-z 0-9 . _ -, not starting with '.'.",
            examples=["demo"],
            # Documented here, enforced by the domain's validator (one rule, clearer message).
            json_schema_extra={
                "minLength": 1,
                "maxLength": MAX_REGISTRY_NAME_CHARS,
                "pattern": REGISTRY_NAME_PATTERN,
            },
        ),
    ],
) -> str:
    """The registry path parameter, validated before anything else uses it (422 if bad)."""
    return validate_registry_name(registry)


RegistryPath = Annotated[str, Depends(registry_name)]
ToolPath = Annotated[
    str,
    Path(
        description="Tool name as uploaded; it may contain slashes.",
        min_length=1,
        max_length=MAX_TOOL_NAME_CHARS,
    ),
]
ToolQuery = Annotated[
    str,
    Query(
        description="Tool name exactly as uploaded, percent-encoded (slashes and dots too).",
        min_length=1,
        max_length=MAX_TOOL_NAME_CHARS,
        examples=["fs/read_file"],
    ),
]


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return await run_in_threadpool(json.loads, raw)
    except (ValueError, RecursionError) as exc:  # bad syntax, not UTF-8, nested too deep
        raise invalid_body(exc) from exc


class JobNotFound(NotFound):
    def __init__(self, registry: str, job: str) -> None:
        super().__init__(
            f"no write job {job!r} for registry {registry!r} (finished jobs are kept a day, "
            "the last 1,000 per replica; with Redis every replica answers for every job)",
            {"registry": registry, "job": job},
        )


def _out(info: RegistryInfo) -> RegistryInfoOut:
    return RegistryInfoOut(
        registry=info.registry, version=info.version, tools=info.tools, written_at=info.written_at
    )


class WriteJobOut(BaseModel):
    """A large upload being applied in the background (docs/api.md, "Writes are incremental and large uploads answer 202")."""

    job: str = Field(description="Job id; poll GET /registries/{registry}/jobs/{job}.")
    registry: str
    state: Literal["queued", "running", "done", "failed", "superseded"]
    new_texts: int = Field(description="Tool texts to embed (not cached yet) when accepted.")
    created_at: float = Field(description="Unix time the job was accepted.")
    finished_at: float | None = None
    result: RegistryInfoOut | None = Field(None, description="The new version, once done.")
    error: ErrorDetail | None = Field(
        None, description="Why the write failed, once failed; why it was not applied, once superseded."
    )


def _job_out(job: WriteJob) -> WriteJobOut:
    error = None
    if job.error is not None:
        error = ErrorDetail(type=job.error.error_type, message=job.error.message, details=job.error.details)
    return WriteJobOut(
        job=job.id,
        registry=job.registry,
        state=job.state,
        new_texts=job.new_texts,
        created_at=job.created_at,
        finished_at=job.finished_at,
        result=_out(job.info) if job.info is not None else None,
        error=error,
    )


def _job_url(job: WriteJob) -> str:
    return f"/registries/{job.registry}/jobs/{job.id}"


async def _write(kind: str, registry: str, request: Request, core: Shortlister) -> Any:
    """Parse the body off the event loop, then validate and apply the write in a worker; a
    write with many texts to embed answers 202 with a job to poll (``Location``)."""
    payload = await _json_body(request)
    result = await run_in_threadpool(core.submit_write, kind, registry, payload)
    if isinstance(result, WriteJob):
        body = _job_out(result).model_dump(mode="json")
        return JSONResponse(body, status_code=202, headers={"Location": _job_url(result)})
    return _out(result)


WRITE_RESPONSES: dict[int | str, dict[str, Any]] = {
    202: {
        "model": WriteJobOut,
        "description": "Accepted: many new texts to embed; poll the job in Location",
        "headers": {"Location": {"description": "The job's URL.", "schema": {"type": "string"}}},
    },
    **error_responses(409, 413, 415, 422, 429, 503),
}


@admin_router.put(
    "/{registry}",
    response_model=RegistryInfoOut,
    responses=WRITE_RESPONSES,
    openapi_extra=TOOLS_BODY_OPENAPI,
)
async def put_registry(registry: RegistryPath, request: Request, core: CoreDep) -> Any:
    """Replace a registry's tools (creating it if needed); the version increases. An upload
    with more than ``async_write_min_texts`` new texts answers 202 with a job to poll."""
    return await _write("put", registry, request, core)


@admin_router.post(
    "/{registry}/tools",
    response_model=RegistryInfoOut,
    responses=WRITE_RESPONSES,
    openapi_extra=TOOLS_BODY_OPENAPI,
)
async def upsert_tools(registry: RegistryPath, request: Request, core: CoreDep) -> Any:
    """Add or replace tools by name, keeping the rest; creates the registry if missing. Many
    new texts: 202 and a job to poll, as for PUT."""
    return await _write("upsert", registry, request, core)


@admin_router.get(
    "/{registry}/jobs/{job}",
    response_model=WriteJobOut,
    responses=error_responses(404, 422, 503),
)
def write_job(
    registry: RegistryPath,
    job: Annotated[str, Path(description="Job id from a 202.", min_length=1, max_length=64)],
    core: CoreDep,
) -> WriteJobOut:
    """State of a large upload accepted with 202: queued, running, done (with the new
    version), failed (with the error) or superseded (a later write or a DELETE of the
    registry was acknowledged first; nothing applied). Jobs are persisted before the 202 and
    survive a restart (an interrupted one runs again, or reports failed saying why)."""
    found = core.write_job(registry, job)
    if found is None:
        raise JobNotFound(registry, job)
    return _job_out(found)


@router.get("", response_model=RegistryList, responses=error_responses(503))
def list_registries(core: CoreDep) -> RegistryList:
    """List every registry with its current version and size."""
    return RegistryList(registries=[_out(info) for info in core.list_registries()])


@router.get("/{registry}", response_model=RegistryOut, responses=error_responses(404, 422, 503))
def get_registry(registry: RegistryPath, core: CoreDep) -> RegistryOut:
    """Return a registry's current version with its tool definitions as uploaded."""
    snap = core.snapshot(registry)
    return RegistryOut(
        registry=snap.registry,
        version=snap.version,
        written_at=snap.written_at,
        tools=snap.definitions(),
        equivalents=[list(group) for group in snap.equivalents],
        embedder=snap.embedder or None,
    )


@router.get("/{registry}/graph", response_model=RegistryGraph, responses=error_responses(404, 422, 503))
def get_graph(registry: RegistryPath, core: CoreDep) -> RegistryGraph:
    """The registry's prerequisite graph: which tool to call before which, each edge with its evidence."""
    return RegistryGraph.model_validate(core.graph(registry))


@admin_router.post(
    "/{registry}/graph", response_model=RegistryInfoOut, responses=error_responses(404, 409, 415, 422, 503)
)
def edit_graph(registry: RegistryPath, body: GraphEditRequest, core: CoreDep) -> RegistryInfoOut:
    """Add or remove prerequisite edges; the version increases. Unknown tools: 422, nothing changed."""
    return _out(core.edit_graph(registry, body.add, body.remove))


@router.get(
    "/{registry}/report", response_model=ToolReport, responses=error_responses(404, 422, 503)
)
def report(registry: RegistryPath, core: CoreDep) -> ToolReport:
    """Tool efficiency from agents' feedback: per-tool utility and the tools worth pruning."""
    return ToolReport.model_validate(core.report(registry))


@admin_router.delete("/{registry}", status_code=204, responses=error_responses(404, 422, 503))
def delete_registry(registry: RegistryPath, core: CoreDep) -> Response:
    """Delete a registry and all its versions."""
    core.delete_registry(registry)
    return Response(status_code=204)


@admin_router.delete(
    "/{registry}/tools",
    status_code=204,
    responses=error_responses(404, 409, 422, 503),
)
def delete_tool(registry: RegistryPath, name: ToolQuery, request: Request, core: CoreDep) -> Response:
    """Remove one tool, named in the query string (``?name=fs/read_file``): no name, whatever
    it holds, can be resolved by a browser or a client into another route. The version increases."""
    if len(request.query_params.getlist("name")) > 1 or set(request.query_params) != {"name"}:
        problem = "send exactly one query parameter, name=<tool name>"
        raise ValidationFailed(problem, [{"field": "query", "message": problem}])
    core.delete_tool(registry, name)
    return Response(status_code=204)


@admin_router.delete(
    "/{registry}/tools/{name:path}",
    status_code=204,
    responses=error_responses(404, 409, 422, 503),
    deprecated=True,
)
def delete_tool_in_path(registry: RegistryPath, name: ToolPath, core: CoreDep) -> Response:
    """Remove one tool named in the path (deprecated: use ``DELETE .../tools?name=``). Only a
    name that URLs carry unchanged is accepted here; others get 422 pointing to the query form."""
    problem = url_name_problem(name)
    if problem is not None:
        message = (
            f"tool name {problem}; name it in the query string instead: "
            f"DELETE /registries/{registry}/tools?name=<percent-encoded name>"
        )
        raise ValidationFailed(message, [{"field": "name", "message": message, "tool": name}])
    core.delete_tool(registry, name)
    return Response(status_code=204)
