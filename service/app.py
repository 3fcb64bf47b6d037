"""App factory: wires settings, state, routes, middleware and error handlers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from anyio import to_thread
from fastapi import Depends, FastAPI

from registry.serving.depth_policies import TunableDepthPolicy
from service.auth import log_access_mode, metrics_tokens
from service.deps import require_admin, require_query
from service.errors import install_error_handlers
from service.mcp import McpFace
from service.methods import method_not_allowed
from service.middleware import (
    BodyLimitMiddleware,
    EarlyAuthMiddleware,
    HostGuardMiddleware,
    HttpMetricsMiddleware,
    RequestIdMiddleware,
)
from service.routes import console, feedback, health, registries, shortlist
from service.routes import learning as learning_routes
from service.routes import policies as policy_routes
from service.schemas import error_responses
from service.schemas_openapi import document_settings
from service.settings import ServiceSettings
from service.state import EmbedderFactory, ServiceState

DESCRIPTION = """Per-query tool shortlists for LLM agents. Upload tool registries, ask
`POST /shortlist`, get back the tools the agent should see: as many as a learned
Bits-over-Random depth policy judges this query needs."""


def create_app(
    settings: ServiceSettings | None = None,
    *,
    embedder_factory: EmbedderFactory | None = None,
    bor_policy: TunableDepthPolicy | None = None,
    background_load: bool = True,
) -> FastAPI:
    """Build the FastAPI app. Heavy objects are created in the lifespan, not at import."""
    settings = settings or ServiceSettings()
    # Built here (not in the lifespan) so a bad policy artifact fails before serving starts.
    state = ServiceState(settings, embedder_factory=embedder_factory, bor_policy=bor_policy)
    mcp = McpFace(state.core, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Sync routes run on anyio's pool (40 threads by default). On 2 cores more than a few
        # in flight only queue on the CPU, and every extra thread keeps its own buffers.
        to_thread.current_default_thread_limiter().total_tokens = settings.worker_threads
        state.start_loading(background=background_load)
        async with mcp.running():  # the MCP session manager's task group
            yield
        state.close()

    app = FastAPI(
        title="tool-shortlist",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served offline by service.routes.console
        redoc_url=None,
    )
    app.state.service = state
    install_error_handlers(app)
    app.add_exception_handler(405, method_not_allowed)  # Allow lists the whole path's methods
    # No 307 from '/registries/demo%2f' to '/registries/demo': a PUT must not land elsewhere.
    app.router.redirect_slashes = False
    # Routers are guarded only when tokens are configured, so OpenAPI shows exactly what is.
    admin = require_admin if settings.admin_token else None
    query = require_query if settings.query_token else None
    app.include_router(shortlist.router, **_guarded(query))
    app.include_router(feedback.router, **_guarded(query))
    app.include_router(registries.router, **_guarded(query or admin))
    app.include_router(registries.admin_router, **_guarded(admin))
    app.include_router(console.live_router, **_guarded(query or admin))
    console.install_pages(app)  # /console, / -> /console, offline /docs and /redoc
    app.include_router(learning_routes.router, **_guarded(query or admin))
    app.include_router(learning_routes.admin_router, **_guarded(admin))
    app.include_router(policy_routes.router, **_guarded(query or admin))
    app.include_router(policy_routes.admin_router, **_guarded(admin))
    app.include_router(health.router)
    build_openapi = app.openapi  # + the limits that are settings (query maxLength)
    app.openapi = lambda: document_settings(build_openapi(), settings.max_query_chars)  # type: ignore[method-assign]
    metrics_guard = health.require_metrics if metrics_tokens(settings) else None
    app.include_router(health.metrics_router, **_guarded(metrics_guard))
    app.router.routes.append(mcp.route())  # /mcp, guarded like /shortlist (service.mcp)
    log_access_mode(settings)
    feedback_limit = (
        min(settings.max_feedback_body_bytes, settings.max_body_bytes),
        "SHORTLIST_MAX_FEEDBACK_BODY_BYTES",
    )
    # A shortlist request is a query and a few options: its bound follows from the query's
    # (every character escaped as \uXXXX at worst), so a body of a million bad keys is a 413,
    # not a million validation problems.
    shortlist_limit = (
        min(6 * settings.max_query_chars + 64 * 1024, settings.max_body_bytes),
        "SHORTLIST_MAX_QUERY_CHARS",
    )
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        path_limits={"/feedback": feedback_limit, "/shortlist": shortlist_limit},
    )
    app.add_middleware(EarlyAuthMiddleware, settings=settings)  # before the body is read
    app.add_middleware(HostGuardMiddleware, allowed=settings.allowed_hosts)  # every route
    app.add_middleware(HttpMetricsMiddleware, metrics=state.metrics)
    app.add_middleware(RequestIdMiddleware)  # outermost: every response carries X-Request-ID
    return app


def _guarded(check: Callable[..., Any] | None) -> dict[str, Any]:
    """``include_router`` arguments that put ``check`` in front of every route, with its 401."""
    if check is None:
        return {}
    return {"dependencies": [Depends(check)], "responses": error_responses(401)}
