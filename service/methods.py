"""405 answers whose ``Allow`` header lists every method the path accepts.

Starlette answers a 405 with the methods of the first route whose path matched, but one path
may be served by several routes (``/registries/{registry}``: GET in the read router, PUT and
DELETE in the admin router), so its ``Allow`` was wrong (RFC 9110 section 15.5.6).
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from service.errors import error_response

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> list[str]:
    """The methods some route fully matches for this request's path, in :data:`METHODS` order.

    Each method is tried through the routes' public ``matches`` on a fresh scope (routers that
    FastAPI includes are nested, so their routes are not listed flat).
    """
    allowed = []
    for method in METHODS:
        probe = {
            "type": "http",
            "method": method,
            "path": request.scope["path"],
            "root_path": request.scope.get("root_path", ""),
            "headers": [],
        }
        if any(route.matches(dict(probe))[0] is Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


async def method_not_allowed(request: Request, exc: Exception) -> JSONResponse:
    """The 405 handler: the API's error body, with the ``Allow`` header of the whole path."""
    detail = exc.detail if isinstance(exc, HTTPException) else "Method Not Allowed"
    allowed = allowed_methods(request)
    response = error_response(
        405, "method_not_allowed", f"{detail}: {request.method} is not one of {', '.join(allowed)}",
        {"allowed": allowed},
    )
    response.headers["Allow"] = ", ".join(allowed)
    return response
