"""Builds a service's :class:`~registry.learning.learner.UsageLearner` for its store (local
files, or the shared Redis with a reader of its own on the shared feedback log)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from typing import Any

from registry.feedback import FeedbackLog, LogCompacted
from registry.index.embed import Embedder
from registry.learning.learner import UsageLearner
from registry.learning.persist import LearningStore, LocalLearningStore, RedisLearningStore
from registry.learning.usage import UsageEvent
from registry.settings import Settings
from registry.store.base import SharedStore, Store
from registry.writes.engine import ShortlistEngine

__all__ = ["build_learner", "start_learner"]

log = logging.getLogger(__name__)


def build_learner(settings: Settings, store: Store, engine_ref: Any) -> UsageLearner:
    """A learner (not attached yet) over ``store``; ``engine_ref()`` is the loaded engine or None."""

    def known_tools(registry: str) -> Collection[str] | None:
        engine: ShortlistEngine | None = engine_ref()
        snap = engine.current(registry) if engine is not None else None
        return None if snap is None else snap.by_name

    learning_store: LearningStore
    if isinstance(store, SharedStore) and hasattr(store, "client"):
        learning_store = RedisLearningStore(store.client, settings.redis_prefix)
    else:
        learning_store = LocalLearningStore(settings.data_dir)
    return UsageLearner(settings, learning_store, known_tools)


def start_learner(
    learner: UsageLearner,
    engine: ShortlistEngine,
    embedder: Embedder,
    feedback_log: FeedbackLog,
    store: Store,
    *,
    background: bool = True,
) -> None:
    """Attach ``learner`` to the loaded ``engine``: restore saved memories, then fold the logged
    events after them (local log), or tail the shared log (Redis) on the learner's thread."""
    registries = [info.registry for info in engine.list_registries()]
    if isinstance(store, SharedStore) and hasattr(store, "client"):
        from registry.store.redis import RedisFeedbackLog

        reader = RedisFeedbackLog(store.client, learner.settings.redis_prefix)

        def shared_events() -> Iterable[UsageEvent]:
            try:
                return reader.read_new(include_own=True)
            except LogCompacted:  # fell behind a compaction: the compactor's saved memories
                learner.restore_saved(info.registry for info in engine.list_registries())
                reader.rewind()  # then what is left (duplicates are skipped)
                return reader.read_new(include_own=True)

        learner.attach(embedder.embed_query, registries, source=shared_events, background=background)
    else:
        learner.attach(embedder.embed_query, registries, backlog=feedback_log.replay(), background=background)
