"""Registry admin routes: upload, upsert, list, read, delete."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.concurrency import run_in_threadpool

from registry.engine import RegistryInfo
from registry.tools import MAX_REGISTRY_NAME_CHARS, REGISTRY_NAME_PATTERN, validate_registry_name
from service.deps import CoreDep, require_json
from service.errors import invalid_body
from service.schemas import (
    MAX_TOOL_NAME_CHARS,
    TOOLS_BODY_OPENAPI,
    RegistryInfoOut,
    RegistryList,
    RegistryOut,
    ToolReport,
    error_responses,
)

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


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return await run_in_threadpool(json.loads, raw)
    except (ValueError, RecursionError) as exc:  # bad syntax, not UTF-8, nested too deep
        raise invalid_body(exc) from exc


def _out(info: RegistryInfo) -> RegistryInfoOut:
    return RegistryInfoOut(
        registry=info.registry, version=info.version, tools=info.tools, written_at=info.written_at
    )


async def _write(
    write: Callable[[str, Any], RegistryInfo], registry: str, request: Request
) -> RegistryInfoOut:
    """Parse the body off the event loop, then apply ``write`` (a core method) in a worker."""
    payload = await _json_body(request)
    return _out(await run_in_threadpool(write, registry, payload))


@admin_router.put(
    "/{registry}",
    response_model=RegistryInfoOut,
    responses=error_responses(409, 413, 415, 422, 503),
    openapi_extra=TOOLS_BODY_OPENAPI,
)
async def put_registry(registry: RegistryPath, request: Request, core: CoreDep) -> RegistryInfoOut:
    """Replace a registry's tools (creating it if needed); the version increases."""
    return await _write(core.put_registry, registry, request)


@admin_router.post(
    "/{registry}/tools",
    response_model=RegistryInfoOut,
    responses=error_responses(409, 413, 415, 422, 503),
    openapi_extra=TOOLS_BODY_OPENAPI,
)
async def upsert_tools(registry: RegistryPath, request: Request, core: CoreDep) -> RegistryInfoOut:
    """Add or replace tools by name, keeping the rest; creates the registry if missing."""
    return await _write(core.upsert_tools, registry, request)


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
    "/{registry}/tools/{name:path}",
    status_code=204,
    responses=error_responses(404, 409, 422, 503),
)
def delete_tool(registry: RegistryPath, name: ToolPath, core: CoreDep) -> Response:
    """Remove one tool (the name may contain slashes); the version increases."""
    core.delete_tool(registry, name)
    return Response(status_code=204)


