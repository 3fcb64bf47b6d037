"""Registry admin routes: upload, upsert, list, read, delete."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from registry.engine import RegistryInfo
from registry.errors import ValidationFailed
from service.deps import EngineDep, StateDep
from service.schemas import (
    TOOLS_BODY_OPENAPI,
    ErrorResponse,
    RegistryInfoOut,
    RegistryList,
    RegistryOut,
    ToolReport,
)

router = APIRouter(prefix="/registries", tags=["registries"])

ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "Unknown registry or tool"},
    413: {"model": ErrorResponse, "description": "Body or registry too large"},
    422: {"model": ErrorResponse, "description": "Invalid input; details name every problem"},
    503: {"model": ErrorResponse, "description": "Not ready yet"},
}


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return await run_in_threadpool(json.loads, raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationFailed(
            f"request body is not valid JSON: {exc}", [{"field": "body", "message": str(exc)}]
        ) from exc


def _out(info: RegistryInfo) -> RegistryInfoOut:
    return RegistryInfoOut(registry=info.registry, version=info.version, tools=info.tools)


@router.put(
    "/{registry}",
    response_model=RegistryInfoOut,
    responses=ERRORS,
    openapi_extra=TOOLS_BODY_OPENAPI,
)
async def put_registry(
    registry: str, request: Request, engine: EngineDep, state: StateDep
) -> RegistryInfoOut:
    """Replace a registry's tools (creating it if needed); the version increases."""
    payload = await _json_body(request)
    info = await run_in_threadpool(engine.put_registry, registry, payload)
    state.registry_changed(info.registry, info.version, info.tools)
    return _out(info)


@router.post(
    "/{registry}/tools",
    response_model=RegistryInfoOut,
    responses=ERRORS,
    openapi_extra=TOOLS_BODY_OPENAPI,
)
async def upsert_tools(
    registry: str, request: Request, engine: EngineDep, state: StateDep
) -> RegistryInfoOut:
    """Add or replace tools by name, keeping the rest; creates the registry if missing."""
    payload = await _json_body(request)
    info = await run_in_threadpool(engine.upsert_tools, registry, payload)
    state.registry_changed(info.registry, info.version, info.tools)
    return _out(info)


@router.get("", response_model=RegistryList, responses={503: ERRORS[503]})
def list_registries(engine: EngineDep) -> RegistryList:
    """List every registry with its current version and size."""
    return RegistryList(registries=[_out(info) for info in engine.list_registries()])


@router.get("/{registry}", response_model=RegistryOut, responses=ERRORS)
def get_registry(registry: str, engine: EngineDep) -> RegistryOut:
    """Return a registry's current version with its tool definitions as uploaded."""
    snap = engine.snapshot(registry)
    return RegistryOut(
        registry=snap.registry,
        version=snap.version,
        tools=snap.definitions(),
        equivalents=[list(group) for group in snap.equivalents],
    )


@router.get("/{registry}/report", response_model=ToolReport, responses=ERRORS)
def report(registry: str, engine: EngineDep, state: StateDep) -> ToolReport:
    """Tool efficiency from agents' feedback: per-tool utility and the tools worth pruning."""
    snap = engine.snapshot(registry)
    settings = state.settings
    data = state.feedback.efficiency.report(
        registry,
        tools=list(snap.by_name),
        min_calls=settings.prune_min_calls,
        min_shown=settings.prune_min_shown,
    )
    return ToolReport.model_validate(data)


@router.delete("/{registry}", status_code=204, responses=ERRORS)
def delete_registry(registry: str, engine: EngineDep, state: StateDep) -> Response:
    """Delete a registry and all its versions."""
    engine.delete_registry(registry)
    state.registry_deleted(registry)
    return Response(status_code=204)


@router.delete("/{registry}/tools/{name:path}", status_code=204, responses=ERRORS)
def delete_tool(registry: str, name: str, engine: EngineDep, state: StateDep) -> Response:
    """Remove one tool (the name may contain slashes); the version increases."""
    info = engine.delete_tool(registry, name)
    state.registry_changed(info.registry, info.version, info.tools)
    return Response(status_code=204)


