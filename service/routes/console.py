"""The operator console (``/console``), offline API docs (``/docs``, ``/redoc``) and the live
window read the console shows (``GET /registries/{registry}/live``).

The console is one static page (``service/console/``) calling the JSON API with the token the
operator types in. The Swagger UI and ReDoc bundles come from the ``fastapi-offline`` package,
so every page works without internet.
"""

from __future__ import annotations

import functools
import math
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from registry.feedback import LiveWindow
from registry.serving.result import Shortlist
from service.deps import CoreDep
from service.routes.registries import RegistryPath
from service.schemas import error_responses

CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console"
CONSOLE_ASSETS = "/console/assets"
DOCS_ASSETS = "/docs-assets"
MATCHES = ("exact", "equivalent")
REDOC_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"

live_router = APIRouter(prefix="/registries", tags=["registries"])

NO_FRAMING: dict[str, str] = {
    "X-Frame-Options": "DENY",  # no clickjacking: an admin's click on "delete" stays theirs
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
CONSOLE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
"""The console's only code is /console/assets/app.js: no inline script or style, no other origin."""
CONSOLE_HEADERS: dict[str, str] = {**NO_FRAMING, "Content-Security-Policy": CONSOLE_CSP}
DOCS_HEADERS: dict[str, str] = {**NO_FRAMING, "Content-Security-Policy": "frame-ancestors 'none'"}
"""Swagger UI and ReDoc start from inline scripts: their pages only refuse to be framed."""


class LiveMatch(BaseModel):
    events: int = Field(description="Feedback events in the window.")
    presented: int = Field(description="Events whose shortlist held a used tool.")
    presentation_rate: float | None = Field(description="presented / events; null without events.")
    mean_p_rand: float | None = Field(description="Mean P_rand of those events.")
    bor_bits: float | None = Field(
        description="log2(presentation_rate / mean_p_rand); null when undefined."
    )


class LiveStats(BaseModel):
    registry: str
    window_seconds: float = Field(description="Length of the sliding window (this process).")
    exact: LiveMatch = Field(description="A used tool itself was shown.")
    equivalent: LiveMatch = Field(description="A used tool or a declared equivalent was shown.")


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def live_stats(window: LiveWindow, registry: str) -> LiveStats:
    """This process's sliding-window presentation rate and BoR for ``registry``."""
    matches = {}
    for match in MATCHES:
        s = window.stats(registry, match)
        matches[match] = LiveMatch(
            events=s.events,
            presented=s.presented,
            presentation_rate=_finite(s.presentation_rate),
            mean_p_rand=_finite(s.mean_p_rand),
            bor_bits=_finite(s.bor_bits),
        )
    return LiveStats(registry=registry, window_seconds=window.window_seconds, **matches)


def explain_depth(result: Shortlist) -> dict[str, Any] | None:
    """The ``explain`` field of a ``POST /shortlist`` answer (``DepthExplanation``): the learned
    policy's margins on the request's own ranking as the query path traced them; ``None`` when
    no learned policy chose the depth (another policy, a fixed ``k``, an empty list)."""
    trace = result.trace
    if trace is None or result.policy != "bor" or not trace.margins:
        return None
    return {
        "margins": [float(m) for m in trace.margins],
        "bias": (result.depth_bias or 0.0) + trace.rule.bias_offset,
        "chosen": trace.chosen,
        "shown": trace.shown,
    }


@live_router.get(
    "/{registry}/live", response_model=LiveStats, responses=error_responses(404, 422, 503)
)
def live(registry: RegistryPath, core: CoreDep) -> LiveStats:
    """Live presentation rate and BoR from agents' feedback over this replica's sliding window
    (``SHORTLIST_LIVE_WINDOW_SECONDS``); the same numbers as the ``shortlist_presentation_rate``
    and ``shortlist_live_bor_bits`` gauges."""
    core.snapshot(registry)  # 404 for an unknown registry
    return live_stats(core.window, registry)


def install_pages(app: FastAPI) -> None:
    """Mount the console, its assets and the offline ``/docs`` and ``/redoc`` on ``app`` (built
    with ``docs_url=None, redoc_url=None``)."""
    docs_static = resources.files("fastapi_offline") / "static"
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"
    title = app.title
    pages = APIRouter(include_in_schema=False)  # one per app: create_app may run many times

    @pages.api_route("/", methods=["GET", "HEAD"])
    def root() -> RedirectResponse:
        return RedirectResponse("/console", status_code=307)

    @pages.api_route("/console", methods=["GET", "HEAD"])
    def console() -> FileResponse:
        return FileResponse(
            CONSOLE_DIR / "index.html", media_type="text/html", headers=CONSOLE_HEADERS
        )

    @pages.api_route("/docs", methods=["GET", "HEAD"])
    def swagger() -> HTMLResponse:
        return _unframed(get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            oauth2_redirect_url=oauth2_redirect,
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},  # the default badge calls out
        ))

    @pages.get(oauth2_redirect)
    def swagger_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @pages.api_route("/redoc", methods=["GET", "HEAD"])
    def redoc() -> HTMLResponse:
        return _unframed(get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title} - ReDoc",
            redoc_js_url=f"{DOCS_ASSETS}/redoc.js",
            redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        ))

    @pages.get(f"{DOCS_ASSETS}/redoc.js")
    def redoc_js() -> Response:
        return Response(_redoc_bundle(), media_type="text/javascript")

    app.include_router(pages)
    app.mount(CONSOLE_ASSETS, StaticFiles(directory=CONSOLE_DIR), name="console-assets")
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(docs_static)), name="docs-assets")


def _unframed(page: HTMLResponse) -> HTMLResponse:
    page.headers.update(DOCS_HEADERS)
    return page


@functools.cache
def _redoc_bundle() -> bytes:
    """ReDoc's bundle with its side-menu logo pointed here: it always loads it from a CDN."""
    bundle = (resources.files("fastapi_offline") / "static" / "redoc.standalone.js").read_bytes()
    return bundle.replace(REDOC_LOGO, f"{DOCS_ASSETS}/favicon.png".encode())
