"""Learning from feedback, per registry: read, switch on/off, wipe (docs/learning.md)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from service.deps import CoreDep, require_json
from service.routes.registries import RegistryPath
from service.schemas import error_responses
from service.schemas_admin import LearningReport, LearningSwitch

# Reads need a query token, changes an admin token (create_app guards each router).
router = APIRouter(prefix="/registries", tags=["learning"])
admin_router = APIRouter(prefix="/registries", tags=["learning"], dependencies=[Depends(require_json)])


@router.get(
    "/{registry}/learning", response_model=LearningReport, responses=error_responses(404, 422, 503)
)
def learning_report(registry: RegistryPath, core: CoreDep) -> LearningReport:
    """What the registry's usage memory learned from feedback, and whether it is on."""
    return LearningReport.model_validate(core.learning_report(registry))


@admin_router.put(
    "/{registry}/learning",
    response_model=LearningReport,
    responses=error_responses(404, 415, 422, 503),
)
def set_learning(registry: RegistryPath, body: LearningSwitch, core: CoreDep) -> LearningReport:
    """Switch learning on or off for a registry, on every replica (what it learned is kept)."""
    return LearningReport.model_validate(core.set_learning(registry, body.enabled))


@admin_router.delete(
    "/{registry}/learning", response_model=LearningReport, responses=error_responses(404, 422, 503)
)
def wipe_learning(registry: RegistryPath, core: CoreDep) -> LearningReport:
    """Forget everything the registry learned from feedback, on every replica."""
    return LearningReport.model_validate(core.wipe_learning(registry))
