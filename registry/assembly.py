"""The one assembly: every part of a core built from settings, in dependency order.

:func:`assemble` picks the store backend by name (:data:`STORE_BACKENDS`: local files, or one
Redis shared by replicas), then builds, each from what came before it::

    stores        registries, remembered shortlists, feedback log, learning, policies, jobs
    embedder      a handle start-up loads (behind the query cache when it is on); the
                  relevance and coverage models likewise
    snapshots     the registry name -> current snapshot map both paths share
    queries       the QueryRunner (serving) reading the snapshots
    writer        the RegistryWriter (writes) installing into them
    learner       the usage memory, knowing the snapshots' tools
    recorder      remembered shortlists, the feedback log, live window and per-tool counts
    policies      per-registry stop rules and refits (which replay the runner's rankings)
    sync          the replica sync (shared store only)
    startup       the loading sequence over all of the above

and returns them as :class:`Parts`. Nothing is wired after construction: a part that needs
another is built after it, or is handed a small callable built first (the registry listeners,
the shortlist losses). The core (:class:`registry.core.Shortlister`) only uses the parts; this
module and :mod:`registry.store` are the only ones that know which backend runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from registry.errors import RegistryNotFound, ValidationFailed
from registry.feedback import FeedbackEvent, FeedbackRecorder, LiveWindow, ToolEfficiency
from registry.index.embed import Embedder
from registry.index.embedder_handle import EmbedderHandle
from registry.learning.evidence import evidence_config
from registry.learning.learner import UsageLearner
from registry.learning.manager import PolicyManager, RefitHooks, RefitJob
from registry.learning.refit_data import Replay
from registry.request import ShortlistRequest
from registry.serving.coverage import CoverageFile
from registry.serving.depth_policies import OnnxDepthPolicy, TunableDepthPolicy
from registry.serving.features import FEATURE_WINDOW
from registry.serving.relevance import Relevance, RelevanceFile
from registry.serving.replay import base_ranking
from registry.serving.result import Shortlist
from registry.serving.shortlist import QueryRunner, UsageRerank
from registry.serving.stop_rules import PolicyBook
from registry.settings import (
    EmbedderArgs,
    EngineArgs,
    FeedbackArgs,
    LearningArgs,
    RefitArgs,
    ServingArgs,
    Settings,
    StoreArgs,
)
from registry.snapshots import RegistryListeners, Snapshots
from registry.startup import ShortlistLosses, Startup, WriteBackAfterWipe
from registry.store.base import Store
from registry.store.local_stores import local_stores
from registry.store.redis_stores import redis_stores
from registry.store.stores import StoreBackend, Stores
from registry.writes.sync import StoreSync
from registry.writes.write_jobs import WriteJobs
from registry.writes.writer import RegistryWriter

__all__ = [
    "STORE_BACKENDS",
    "EmbedderFactory",
    "Parts",
    "Registries",
    "assemble",
    "refit_from_settings",
    "store_backend",
]

EmbedderFactory = Callable[[EmbedderArgs], Embedder]

STORE_BACKENDS: dict[str, StoreBackend] = {"local": local_stores, "redis": redis_stores}
"""Every store backend by name; :func:`store_backend` says which one the settings choose."""


def store_backend(settings: StoreArgs) -> StoreBackend:
    """The backend ``SHORTLIST_STORE_BACKEND`` names; unset: Redis when the settings name one,
    else local files.

    Raises:
        ValidationFailed: no backend has that name (the message lists the ones there are).
    """
    name = settings.store_backend or ("redis" if settings.redis_url is not None else "local")
    backend = STORE_BACKENDS.get(name)
    if backend is None:
        known = ", ".join(sorted(STORE_BACKENDS))
        raise ValidationFailed(
            f"unknown store backend {name!r} (SHORTLIST_STORE_BACKEND); known: {known}",
            [{"field": "store_backend", "message": f"not one of {known}"}],
        )
    return backend


def build_stores(settings: Settings) -> Stores:
    """Every store of the backend the settings choose (:func:`store_backend`)."""
    return store_backend(settings)(StoreArgs.of(settings), FeedbackArgs.of(settings))


def policy_manager(settings: Settings, stores: Stores, book: PolicyBook, hooks: RefitHooks | None = None) -> PolicyManager:
    """The refits over ``stores`` as the settings configure them; a server's and ``shortlist
    refit``'s are the same one (without ``hooks`` a refit does not consult the query path)."""
    return PolicyManager(
        book,
        stores.feedback_log,
        RefitArgs.of(settings),
        stores.job_records,
        hooks,
        evidence=evidence_config(LearningArgs.of(settings)),
        lease_seconds=settings.job_lease_seconds,
    )


@runtime_checkable
class HoldsBackWrites(Protocol):
    """Remembered shortlists that keep writes back while their store is down (Redis)."""

    def flush_pending(self) -> None:
        """Write what an outage held back; raises while the store is still down."""
        ...


@dataclass(frozen=True, slots=True)
class Parts:
    """Everything a core is made of (see the module docstring for what each part is)."""

    settings: Settings
    stores: Stores
    embedder: EmbedderHandle
    bor_policy: TunableDepthPolicy
    snapshots: Snapshots
    queries: QueryRunner
    writer: RegistryWriter
    write_jobs: WriteJobs
    listeners: RegistryListeners
    window: LiveWindow
    learner: UsageLearner
    recorder: FeedbackRecorder
    policies: PolicyManager
    sync: StoreSync | None
    startup: Startup


def assemble(
    settings: Settings,
    *,
    store: Store | None = None,
    embedder_factory: EmbedderFactory | None = None,
    bor_policy: TunableDepthPolicy | None = None,
) -> Parts:
    """Every part of a core for ``settings``.

    Args:
        settings: everything; nothing else is read from the environment.
        store: a registry store to use instead of the backend's (the other stores stay).
        embedder_factory: builds the embedder when start-up loads it (default: the settings'
            MiniLM; tests inject a fast one).
        bor_policy: the learned depth policy (default: the ONNX policy in ``policy_dir``,
            loaded here so a broken artifact fails at assembly, before serving).
    """
    if embedder_factory is None:
        from registry.index.embedders import default_embedder

        embedder_factory = default_embedder
    policy: TunableDepthPolicy = bor_policy or OnnxDepthPolicy.from_dir(settings.policy_dir)
    stores = build_stores(settings)
    if store is not None:
        stores = replace(stores, registries=store)
    embedder = EmbedderHandle(functools.partial(embedder_factory, EmbedderArgs.of(settings)), settings.query_cache_size)
    snapshots = Snapshots()

    def known_tools(registry: str) -> Collection[str] | None:
        snap = snapshots.current(registry)
        return None if snap is None else snap.by_name

    learner = UsageLearner(
        LearningArgs.of(settings),
        stores.learning,
        known_tools,
        refit_margin=settings.refit_margin,
        poll_seconds=settings.sync_interval_seconds,
        require_caller=settings.callers_required(),
    )
    book = PolicyBook(stores.policies)
    relevance = RelevanceFile(settings.resolved_relevance_model())  # read by start-up
    coverage = CoverageFile(settings.coverage_model)  # read by start-up
    queries = QueryRunner(
        ServingArgs.of(settings), embedder, policy, relevance, usage=learner, policy_book=book, coverage=coverage
    )
    writer = RegistryWriter(settings, stores.registries, embedder, snapshots)
    write_jobs = WriteJobs(stores.job_records, limit=settings.write_queue_max, lease_seconds=settings.job_lease_seconds)
    losses = ShortlistLosses(stores.registries)
    window = LiveWindow(settings.live_window_seconds)
    recorder = FeedbackRecorder(
        stores.shortlists,
        stores.feedback_log,
        window,
        ToolEfficiency(),
        compact_after_events=settings.feedback_compact_events,
        compact_after_bytes=settings.feedback_compact_bytes,
        max_event_bytes=settings.max_feedback_event_bytes,
        min_compact_interval_seconds=settings.feedback_compact_interval_seconds,
        compact_margin_seconds=settings.feedback_compact_margin_seconds,
        before_compact=learner.checkpoint,  # no learned evidence only in memory
        losses=losses,
    )
    policies = policy_manager(settings, stores, book, refit_hooks(settings, snapshots, queries, learner))
    listeners = RegistryListeners()
    sync = None
    if stores.shared:
        memory = stores.shortlists
        sync = StoreSync(
            writer,
            stores.registries,  # type: ignore[arg-type]  # stores.shared: a SharedStore
            interval=settings.sync_interval_seconds,
            feedback=recorder,
            on_tick=memory.flush_pending if isinstance(memory, HoldsBackWrites) else None,
            learned=WriteBackAfterWipe(write_jobs, policies, learner),
        )
    startup = Startup(
        settings,
        stores,
        embedder,
        relevance,
        coverage,
        writer,
        learner,
        policies,
        recorder,
        write_jobs,
        sync,
        losses,
        on_change=listeners,
        wrap_write=lambda prepared: prepared.announcing(listeners),
    )
    return Parts(
        settings, stores, embedder, policy, snapshots, queries, writer, write_jobs, listeners, window,
        learner, recorder, policies, sync, startup,
    )


@dataclass(frozen=True, slots=True)
class Registries:
    """Registries served in-process without the rest of a core (no feedback, learning or sync):
    a writer and a query runner over one snapshot map, as the core composes them. For
    benchmarks, studies and unit tests; a service uses :class:`registry.core.Shortlister`."""

    settings: EngineArgs
    snapshots: Snapshots
    writer: RegistryWriter
    queries: QueryRunner

    @classmethod
    def build(
        cls,
        settings: EngineArgs,
        store: Store,
        embedder: Embedder,
        bor_policy: TunableDepthPolicy,
        *,
        relevance: Relevance | None = None,
        usage: UsageRerank | None = None,
        policy_book: PolicyBook | None = None,
    ) -> Registries:
        snapshots = Snapshots()
        queries = QueryRunner(ServingArgs.of(settings), embedder, bor_policy, relevance, usage=usage, policy_book=policy_book)
        return cls(settings, snapshots, RegistryWriter(settings, store, embedder, snapshots), queries)

    def shortlist(self, request: ShortlistRequest, token_scope: Sequence[str] | None = None) -> Shortlist:
        """``request`` resolved and answered on its registry's current snapshot (as the core
        does, without remembering it)."""
        resolved = request.resolve(self.settings, self.queries, token_scope)
        return self.queries.run(self.snapshots.snapshot(request.registry), resolved)


def refit_hooks(settings: Settings, snapshots: Snapshots, queries: QueryRunner, learner: UsageLearner) -> RefitHooks:
    """What each depth-policy refit borrows from the query path: the usage-profile fit on the
    registry's rankings, and a replay of its logged requests as they are served now (both
    None while the registry is not loaded)."""

    def fit_profiles(registry: str, events: list[FeedbackEvent]) -> dict[str, Any] | None:
        """A refit's first step: the registry's learned companions and usage-profile weight
        (None: learning is off)."""
        snap = snapshots.current(registry)
        if snap is None or not learner.enabled(registry):
            return None
        companions = learner.fit_companions(snap, events)

        def ranked(text: str, usage: Any = queries.usage) -> tuple[tuple[str, ...], Any]:
            return base_ranking(snap, text, FEATURE_WINDOW, scorer=settings.default_scorer,
                                embedder=queries.embedder, usage=usage)

        plain = functools.partial(ranked, usage=None)  # the memory's neighbourhood is fitted on the base scorer
        return {**learner.fit_profile_weight(snap, events, ranked, plain_ranking=plain), "companions": companions}

    def replay(registry: str) -> Replay | None:
        """A refit's events ranked again as ``registry`` is served now (None: not loaded)."""
        snap = snapshots.current(registry)
        if snap is None:
            return None
        return lambda event: queries.replay(snap, event.query, len(event.margins))

    return RefitHooks(fit_profiles, replay)


def refit_from_settings(settings: Settings, registry: str) -> RefitJob:
    """``shortlist refit``: refit one registry from the configured backend's feedback log
    (local directory or Redis), outside any server; running replicas pick the result up (Redis:
    on their next policy poll; local: at restart).

    Raises:
        RegistryNotFound: Neither the store, the feedback log nor the policy book knows that name.
    """
    stores = build_stores(settings)
    manager = policy_manager(settings, stores, PolicyBook(stores.policies))
    try:
        # A refit of a name nobody created (a typo) would find no feedback and report "refused":
        # say so instead. A name the store lacks but the feedback log or the policy book knows
        # is real (its shortlists were served; the refit runs before any server uploads it), so
        # it refits. The events read here are cached: the refit does not read the log again.
        if (
            registry not in stores.registries.list_registries()
            and not manager.events.of(registry)
            and not manager.book.history(registry).versions
        ):
            raise RegistryNotFound(registry)
        return manager.refit(registry)
    finally:
        manager.close()
