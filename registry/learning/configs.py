"""The learning loop's knobs, read from the learning group in one place."""

from __future__ import annotations

from registry.learning.evidence import evidence_config
from registry.learning.profiles import ProfileConfig
from registry.learning.usage import UsageConfig
from registry.settings import LearningArgs

__all__ = ["profile_config", "usage_config"]


def usage_config(learning: LearningArgs, *, require_caller: bool = False) -> UsageConfig:
    """The memory's knobs; ``require_caller`` when callers are identified (query tokens)."""
    return UsageConfig(
        per_tool=learning.learning_per_tool,
        per_registry=learning.learning_per_registry,
        similarity=learning.learning_similarity,
        beta=learning.learning_beta,
        candidates=learning.learning_candidates,
        evidence=evidence_config(learning),
        require_caller=require_caller,
    )


def profile_config(learning: LearningArgs, margin: float) -> ProfileConfig:
    """The usage profiles' knobs; ``margin`` is the refits' (``SHORTLIST_REFIT_MARGIN``)."""
    return ProfileConfig(
        candidates=learning.learning_candidates,
        evidence=evidence_config(learning),
        margin=margin,
    )
