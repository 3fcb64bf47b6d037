"""App factory: wires settings, state, routes, middleware and error handlers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from registry.depth.policies import DepthPolicy
from registry.settings import Settings
from service.errors import install_error_handlers
from service.middleware import BodyLimitMiddleware, HttpMetricsMiddleware
from service.routes import feedback, health, registries, shortlist
from service.state import EmbedderFactory, ServiceState, default_embedder

DESCRIPTION = """Per-query tool shortlists for LLM agents. Upload tool registries, ask
`POST /shortlist`, get back the tools the agent should see: as many as a learned
Bits-over-Random depth policy judges this query needs."""


def create_app(
    settings: Settings | None = None,
    *,
    embedder_factory: EmbedderFactory = default_embedder,
    bor_policy: DepthPolicy | None = None,
    background_load: bool = True,
) -> FastAPI:
    """Build the FastAPI app. Heavy objects are created in the lifespan, not at import."""
    settings = settings or Settings()
    # Built here (not in the lifespan) so a bad policy artifact fails before serving starts.
    state = ServiceState(settings, embedder_factory=embedder_factory, bor_policy=bor_policy)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start_loading(background=background_load)
        yield

    app = FastAPI(
        title="tool-shortlist",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.service = state
    install_error_handlers(app)
    app.include_router(shortlist.router)
    app.include_router(feedback.router)
    app.include_router(registries.router)
    app.include_router(health.router)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(HttpMetricsMiddleware, metrics=state.metrics)
    return app
