"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Request, Response, Security
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.auth import BearerScheme, authenticate, metrics_tokens
from service.deps import StateDep
from service.errors import error_response
from service.schemas import ErrorResponse, Health, Readiness

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """Liveness: the process is up and answering."""
    return Health(status="ok")


# An absolute path: a '/' not preceded by a word character, ':' or '/' (so no URL), at least
# two components. Only its last one is shown: /readyz is open, the log has the whole path.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:[^\s'\"/:,;()]+/)+([^\s'\"/:,;()]*)")


def redact_paths(text: str) -> str:
    """``cannot read /var/lib/shortlist/x.json`` -> ``cannot read .../x.json``."""
    return _ABSOLUTE_PATH.sub(lambda m: ".../" + m.group(1), text)


@router.get("/readyz", response_model=Readiness, responses={503: {"model": ErrorResponse}})
def readyz(state: StateDep) -> Response | Readiness:
    """Readiness: 200 once the model, the policy and every registry are loaded, else 503
    (the reason, with file paths cut to their last component)."""
    if state.ready:
        return Readiness(status="ready", warnings=state.core.store_warnings())
    reason = state.load_error or "models and registries are still loading"
    return error_response(503, "unhealthy", f"not ready: {redact_paths(reason)}")


# Its own router: create_app guards it (with its 401 in OpenAPI) only when tokens are set.
metrics_router = APIRouter(tags=["operations"])
metrics_bearer = BearerScheme(
    "MetricsToken",
    "A metrics token (SHORTLIST_METRICS_TOKEN), or a query or admin token: GET /metrics.",
)


async def require_metrics(
    request: Request, authorization: Annotated[str | None, Security(metrics_bearer)]
) -> None:
    """A metrics, query or admin token passes (the metrics name every registry)."""
    settings = request.app.state.service.settings
    authenticate(authorization, metrics_tokens(settings), "a metrics, query or admin token")


@metrics_router.get("/metrics", response_class=Response)
def metrics(state: StateDep) -> Response:
    """Prometheus metrics in the text exposition format."""
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
