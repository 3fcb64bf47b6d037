"""Typed dependencies: routes receive the engine, metrics and settings, never ``app.state``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from registry.engine import ShortlistEngine
from registry.settings import Settings
from service.errors import NotReady
from service.metrics import Metrics
from service.state import ServiceState


def get_state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


StateDep = Annotated[ServiceState, Depends(get_state)]


def get_engine(state: StateDep) -> ShortlistEngine:
    if state.engine is None:
        reason = state.load_error or "models and registries are still loading"
        raise NotReady(f"service not ready: {reason}")
    return state.engine


def get_metrics(state: StateDep) -> Metrics:
    return state.metrics


def get_settings(state: StateDep) -> Settings:
    return state.settings


EngineDep = Annotated[ShortlistEngine, Depends(get_engine)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
