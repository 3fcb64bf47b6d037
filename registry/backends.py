"""Every backend a core needs, built from settings in one place: local files, or one Redis.

:func:`build_backends` picks local-vs-Redis once. In Redis mode the registry store, the feedback
log, the usage-memory store, the job records (with the queue of large writes on them) and the
policy book share one connection; the remembered shortlists
get a second one with a short timeout, so a Redis that stops answering adds at most that to a
query before the outage is noticed. :func:`build_learner` and :func:`start_learner` give the
usage learner its store and, once the engine is loaded, its backlog (local log) or a reader of
its own on the shared log (Redis); :func:`refit_hooks` lends the depth-policy refits the loaded
engine's rankings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, runtime_checkable

from registry.feedback import (
    FeedbackEvent,
    FeedbackLog,
    LocalFeedbackLog,
    LogCompacted,
    RememberedShortlists,
    ShortlistMemory,
)
from registry.index.embed import Embedder
from registry.jobs import JobRecords, LocalJobRecords, RedisJobRecords
from registry.learning.learner import UsageLearner
from registry.learning.manager import PolicyManager, RefitHooks
from registry.learning.persist import LearningStore, LocalLearningStore, RedisLearningStore
from registry.learning.refit_data import Replay
from registry.learning.usage import UsageEvent
from registry.serving.features import FEATURE_WINDOW
from registry.serving.replay import base_ranking
from registry.settings import LearningArgs, Settings
from registry.store.base import SharedStore, Store
from registry.store.caller_key import RedisCallerKey, local_caller_key
from registry.store.local import LocalStore
from registry.writes.engine import ShortlistEngine
from registry.writes.write_jobs import WriteJobs

__all__ = [
    "Backends",
    "HoldsBackWrites",
    "RedisBacked",
    "build_backends",
    "build_learner",
    "refit_hooks",
    "start_learner",
]

log = logging.getLogger(__name__)


@runtime_checkable
class RedisBacked(Protocol):
    """A store kept in Redis, whose connection the other Redis backends may share."""

    client: Any


@runtime_checkable
class HoldsBackWrites(Protocol):
    """Remembered shortlists that keep writes back while their store is down (Redis)."""

    def flush_pending(self) -> None:
        """Write what an outage held back; raises while the store is still down."""
        ...


@dataclass(frozen=True, slots=True)
class Backends:
    """What :func:`build_backends` made; ``redis`` is the shared connection (None: local files)."""

    store: Store
    shortlists: RememberedShortlists
    feedback_log: FeedbackLog
    learning_store: LearningStore
    job_records: JobRecords  # durable background jobs (202 uploads, refits): beside the registries
    write_jobs: WriteJobs  # the queue of large registry writes, on ``job_records``
    redis: Any
    store_health: Any  # registry.store.redis.StoreHealth in Redis mode, else None
    caller_key: Callable[[], bytes]  # keys the caller hashes (registry.store.caller_key)

    @property
    def shared(self) -> bool:
        """Several replicas share the registries (the store is a :class:`SharedStore`)."""
        return isinstance(self.store, SharedStore)

    def policy_manager(
        self, settings: Settings, feedback_log: FeedbackLog, jobs: Any = None, hooks: RefitHooks | None = None
    ) -> PolicyManager:
        """The per-registry stop rules and refits, on the shared connection in Redis mode."""
        return PolicyManager.for_settings(
            settings, feedback_log, shared=self.shared, client=self.redis, jobs=jobs, hooks=hooks
        )


def build_backends(settings: Settings, store: Store | None = None) -> Backends:
    """The backends ``settings`` choose; ``store`` replaces the registry store (tests)."""
    if store is None and settings.redis_url is not None:
        from registry.store.redis import (
            RedisFeedbackLog,
            RedisShortlistMemory,
            RedisStore,
            StoreHealth,
            connect,
        )

        url = settings.redis_url.get_secret_value()
        cluster = settings.redis_cluster_mode()
        client = connect(url, cluster=cluster)
        health = StoreHealth()  # every Redis call reports to it
        prefix = settings.redis_key_prefix()
        job_records: JobRecords = RedisJobRecords(client, prefix)
        return Backends(
            store=RedisStore(client, prefix, health),
            shortlists=RedisShortlistMemory(
                connect(url, timeout=0.5, cluster=cluster), settings.feedback_retention_seconds, prefix, health
            ),
            feedback_log=RedisFeedbackLog(client, prefix, health),
            learning_store=RedisLearningStore(client, prefix),
            job_records=job_records,
            write_jobs=_write_jobs(settings, job_records),
            redis=client,
            store_health=health,
            caller_key=_caller_key(settings) or RedisCallerKey(client, prefix + "caller-key"),
        )
    store = store or LocalStore(settings.data_dir)
    learning_store: LearningStore
    if isinstance(store, SharedStore) and isinstance(store, RedisBacked):
        learning_store = RedisLearningStore(store.client, settings.redis_key_prefix())
    else:
        learning_store = LocalLearningStore(settings.data_dir)
    job_records = LocalJobRecords(settings.data_dir)  # an injected store has no connection to share
    return Backends(
        store=store,
        shortlists=ShortlistMemory(settings.feedback_retention_seconds, settings.max_remembered_shortlists),
        feedback_log=LocalFeedbackLog.in_data_dir(settings.data_dir, archive=settings.feedback_archive),
        learning_store=learning_store,
        job_records=job_records,
        write_jobs=_write_jobs(settings, job_records),
        redis=None,
        store_health=None,
        caller_key=_caller_key(settings) or _fixed(local_caller_key(settings.data_dir)),
    )


def _caller_key(settings: Settings) -> Callable[[], bytes] | None:
    key = settings.caller_key
    return _fixed(key.get_secret_value().encode("utf-8")) if key is not None else None


def _fixed(key: bytes) -> Callable[[], bytes]:
    return lambda: key


EngineRef = Callable[[], ShortlistEngine | None]
"""The loaded engine, or None until the core has loaded it."""


def _write_jobs(settings: Settings, records: JobRecords) -> WriteJobs:
    return WriteJobs(records, limit=settings.write_queue_max, lease_seconds=settings.job_lease_seconds)


def build_learner(settings: Settings, learning_store: LearningStore, engine_ref: EngineRef) -> UsageLearner:
    """A learner (not attached yet) over ``learning_store``; ``engine_ref()`` is the loaded
    engine or None."""

    def known_tools(registry: str) -> Collection[str] | None:
        engine = engine_ref()
        snap = engine.current(registry) if engine is not None else None
        return None if snap is None else snap.by_name

    return UsageLearner(
        LearningArgs.of(settings),
        learning_store,
        known_tools,
        refit_margin=settings.refit_margin,
        poll_seconds=settings.sync_interval_seconds,
        require_caller=settings.callers_required(),
    )


def refit_hooks(settings: Settings, learner: UsageLearner, engine_ref: EngineRef) -> RefitHooks:
    """What each depth-policy refit borrows from the loaded engine (``engine_ref()``, None
    until loaded): the usage-profile fit on the registry's rankings, and a replay of its logged
    requests as they are served now."""

    def fit_profiles(registry: str, events: list[FeedbackEvent]) -> dict[str, Any] | None:
        """A refit's first step: the registry's learned companions and usage-profile weight
        (None: learning is off)."""
        engine = engine_ref()
        snap = engine.current(registry) if engine is not None else None
        if engine is None or snap is None or not learner.enabled(registry):
            return None
        companions = learner.fit_companions(snap, events)
        runner = engine.queries
        if runner is None:
            return {**learner.fit_profile_weight(snap, events), "companions": companions}

        def ranked(text: str, usage: Any = runner.usage) -> tuple[tuple[str, ...], Any]:
            return base_ranking(snap, text, FEATURE_WINDOW, scorer=settings.default_scorer,
                                embedder=runner.embedder, usage=usage)

        plain = partial(ranked, usage=None)  # the memory's neighbourhood is fitted on the base scorer
        return {**learner.fit_profile_weight(snap, events, ranked, plain_ranking=plain), "companions": companions}

    def replay(registry: str) -> Replay | None:
        """A refit's events ranked again as ``registry`` is served now (None: not loaded)."""
        engine = engine_ref()
        snap = engine.current(registry) if engine is not None else None
        if engine is None or snap is None:
            return None
        runner = engine.queries
        return lambda event: runner.replay(snap, event.query, len(event.margins))

    return RefitHooks(fit_profiles, replay)


def start_learner(
    learner: UsageLearner,
    engine: ShortlistEngine,
    embedder: Embedder,
    feedback_log: FeedbackLog,
    store: Store,
    *,
    key_prefix: str,
    background: bool = True,
) -> None:
    """Attach ``learner`` to the loaded ``engine``: restore saved memories, then fold the logged
    events after them (local log), or tail the shared log (Redis) on the learner's thread."""
    registries = [info.registry for info in engine.list_registries()]
    if isinstance(store, SharedStore) and isinstance(store, RedisBacked):
        from registry.store.redis import RedisFeedbackLog

        reader = RedisFeedbackLog(store.client, key_prefix)

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
