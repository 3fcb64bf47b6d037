"""The learning loop's knobs, read from the settings in one place."""

from __future__ import annotations

from registry.learning.evidence import evidence_config
from registry.learning.profiles import ProfileConfig
from registry.learning.usage import UsageConfig
from registry.settings import Settings

__all__ = ["profile_config", "usage_config"]


def usage_config(settings: Settings) -> UsageConfig:
    """The memory's knobs from the settings; callers are required when query tokens are set."""
    return UsageConfig(
        per_tool=settings.learning_per_tool,
        per_registry=settings.learning_per_registry,
        similarity=settings.learning_similarity,
        beta=settings.learning_beta,
        candidates=settings.learning_candidates,
        evidence=evidence_config(settings),
        require_caller=bool(settings.query_token),
    )


def profile_config(settings: Settings) -> ProfileConfig:
    """The usage profiles' knobs from the settings."""
    return ProfileConfig(
        candidates=settings.learning_candidates,
        evidence=evidence_config(settings),
        margin=settings.refit_margin,
    )
