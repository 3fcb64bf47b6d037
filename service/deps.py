"""Typed dependencies: routes receive the core, metrics and settings, never ``app.state``."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import Depends, Request, Security

from registry.core import Shortlister
from service.auth import CALLER_HEADER, BearerScheme, authenticate, caller_hash, token_scope
from service.errors import UnsupportedMediaType, invalid_body
from service.metrics import Metrics
from service.settings import ServiceSettings
from service.state import ServiceState


def get_state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


async def _state(request: Request) -> ServiceState:
    return get_state(request)


# The dependencies below are async on purpose: FastAPI runs a plain `def` dependency on a worker
# thread; three such hops per /shortlist were 16% of the event loop's busy time (py-spy, c8).
StateDep = Annotated[ServiceState, Depends(_state)]


async def get_core(state: StateDep) -> Shortlister:
    """The core once it is ready (503 before: checked ahead of the body, like any dependency)."""
    state.core.require_ready()
    return state.core


async def get_metrics(state: StateDep) -> Metrics:
    return state.metrics


async def get_settings(state: StateDep) -> ServiceSettings:
    return state.settings


CoreDep = Annotated[Shortlister, Depends(get_core)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]


# -- access control (which routers need which token: see service.auth and create_app) ----------

admin_bearer = BearerScheme(
    "AdminToken", "An admin token (SHORTLIST_ADMIN_TOKEN): registry writes, and reads."
)
query_bearer = BearerScheme(
    "QueryToken", "A query token (SHORTLIST_QUERY_TOKEN): /shortlist, /feedback and reads."
)
AdminAuthorization = Annotated[str | None, Security(admin_bearer)]
QueryAuthorization = Annotated[str | None, Security(query_bearer)]
Caller = Literal["admin", "query"]


async def require_admin(request: Request, authorization: AdminAuthorization) -> Caller:
    """Only an admin token passes."""
    authenticate(authorization, get_state(request).settings.admin_token, "an admin token")
    return "admin"


async def require_query(
    request: Request, authorization: AdminAuthorization, _: QueryAuthorization
) -> Caller:
    """A query token or an admin token passes (an admin may query)."""
    settings = get_state(request).settings
    authenticate(
        authorization, (*settings.query_token, *settings.admin_token), "a query or admin token"
    )
    return "query"


AdminDep = Annotated[Caller, Depends(require_admin)]
QueryDep = Annotated[Caller, Depends(require_query)]


async def get_caller_id(request: Request) -> str | None:
    """Hash of the request's bearer token and ``X-Caller-Id`` (None when neither identifies it):
    who sent a query or feedback."""
    headers = request.headers
    state = get_state(request)
    return caller_hash(headers.get("Authorization"), state.settings, headers.get(CALLER_HEADER), state.core.caller_key())


CallerIdDep = Annotated[str | None, Depends(get_caller_id)]


async def get_token_scope(request: Request) -> tuple[str, ...] | None:
    """The tool patterns bound to the request's token (None: unbound): what it may be shown."""
    return token_scope(request.headers.get("Authorization"), get_state(request).settings)


TokenScopeDep = Annotated[tuple[str, ...] | None, Depends(get_token_scope)]


async def require_json(request: Request) -> None:
    """415 unless a request with a body says it is JSON.

    A missing Content-Type is refused too: browsers send text/plain or untyped bodies across
    sites without a CORS preflight, a JSON body they do not.
    """
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    content_type = request.headers.get("content-type")
    if content_type is None:
        raise UnsupportedMediaType(
            "missing Content-Type: send the body as JSON with 'Content-Type: application/json'",
            {"content_type": None},
        )
    media = content_type.split(";", 1)[0].strip().lower()
    json_like = media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )
    if not json_like:
        raise UnsupportedMediaType(
            "request body must be JSON, sent with 'Content-Type: application/json'; "
            f"got {media[:100]!r}",
            {"content_type": media[:100]},
        )
    # json.loads also reads UTF-16 and UTF-32 bodies; the API speaks UTF-8 only (RFC 8259; a
    # UTF-8 byte-order mark is tolerated). The body is cached, so it is read once.
    encoding = json.detect_encoding(await request.body())
    if encoding not in ("utf-8", "utf-8-sig"):
        raise invalid_body(f"it is not UTF-8 (it looks like {encoding.upper()}); send UTF-8 JSON")
