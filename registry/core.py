"""The Shortlister: the one core every face (HTTP, MCP, CLI, in-process users) calls.

Built from settings alone, it owns what a running service needs::

    store          local directory, or Redis shared by replicas (with remembered shortlists
                   and the feedback log in the same Redis)
    engine         registries in, shortlists out (:class:`registry.writes.engine.ShortlistEngine`),
                   loaded in the background so a face can answer health checks meanwhile
    feedback       remembered shortlists, the durable log, live window and per-tool counts
    sync           the thread keeping a replica in step with a shared store
    demo registry  loaded at start-up when configured

The start-up sequence, step by step, and the recovery after a wiped store are
:class:`registry.startup.Startup`.

``shortlist()`` remembers what it served so ``feedback()`` can accept an agent's report,
checked against the registry's current tools. Faces observe the core through listeners
(registry changes, served shortlists, feedback events), e.g. to export metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from registry.backends import (
    build_backends,
    build_learner,
    refit_hooks,
)
from registry.errors import NotReady, RegistryNotFound
from registry.feedback import (
    EquivalenceClasses,
    FeedbackEvent,
    FeedbackListener,
    FeedbackRecorder,
    FeedbackRequest,
    LiveWindow,
    ToolEfficiency,
)
from registry.index.embed import Embedder
from registry.index.minilm_export import default_embedder
from registry.index.query_cache import CachedEmbedder
from registry.index.snapshot import Snapshot
from registry.jobs import JobRecords
from registry.learning.learner import UsageLearner
from registry.names import validate_registry_name
from registry.request import ShortlistRequest
from registry.serving.depth_policies import OnnxDepthPolicy, TunableDepthPolicy
from registry.serving.shortlist import Shortlist
from registry.settings import EmbedderArgs, Settings
from registry.startup import DEMO_REGISTRY, Startup
from registry.store.base import ReportsDamage, SharedStore, Store
from registry.writes.engine import RegistryChange, RegistryInfo, ShortlistEngine
from registry.writes.jobs import PreparedWrite
from registry.writes.sync import StoreSync
from registry.writes.write_jobs import WriteJob, WriteJobs, deleted, later_write

log = logging.getLogger(__name__)

__all__ = [
    "DEMO_REGISTRY",
    "EmbedderFactory",
    "FeedbackResult",
    "RegistryListener",
    "ShortlistListener",
    "Shortlister",
    "default_embedder",
]

EmbedderFactory = Callable[[EmbedderArgs], Embedder]
RegistryListener = Callable[[RegistryChange], None]
ShortlistListener = Callable[[Shortlist], None]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class FeedbackResult:
    """What ``feedback()`` recorded; ``duplicate`` when the id already had feedback (not counted)."""

    event: FeedbackEvent
    duplicate: bool


class Shortlister:
    """Engine, stores, sync and the feedback loop behind one object.

    Args:
        settings: everything; nothing else is read from the environment.
        embedder_factory: builds the embedder when loading starts (tests inject a fast one).
        bor_policy: the learned depth policy (default: the ONNX policy in ``policy_dir``,
            loaded here so a broken artifact fails at construction, before serving).
        store: a registry store to use instead of the one the settings choose.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        embedder_factory: EmbedderFactory = default_embedder,
        bor_policy: TunableDepthPolicy | None = None,
        store: Store | None = None,
    ) -> None:
        self.settings = settings
        self.bor_policy: TunableDepthPolicy = bor_policy or OnnxDepthPolicy.from_dir(
            settings.policy_dir
        )
        backends = build_backends(settings, store)
        self.store: Store = backends.store
        self.store_health: Any = backends.store_health  # registry.store.redis.StoreHealth in Redis mode
        self.caller_key: Callable[[], bytes] = backends.caller_key  # the faces key caller hashes with it
        self.job_records: JobRecords = backends.job_records
        self.write_jobs: WriteJobs = backends.write_jobs
        self.window = LiveWindow(settings.live_window_seconds)
        # usage memory (registry.learning): fed by feedback, lifts rankings, attached at load
        self.learning: UsageLearner = build_learner(settings, backends.learning_store, lambda: self._startup.loading)
        self.feedback_recorder = FeedbackRecorder(
            backends.shortlists,
            backends.feedback_log,
            self.window,
            ToolEfficiency(),
            compact_after_events=settings.feedback_compact_events,
            compact_after_bytes=settings.feedback_compact_bytes,
            max_event_bytes=settings.max_feedback_event_bytes,
            min_compact_interval_seconds=settings.feedback_compact_interval_seconds,
            compact_margin_seconds=settings.feedback_compact_margin_seconds,
            before_compact=self.learning.checkpoint,  # no learned evidence only in memory
        )
        # per-registry depth policies (registry.learning): versions, refits, hot swaps
        self.policies = backends.policy_manager(
            settings,
            self.feedback_recorder.log,
            self.job_records,
            refit_hooks(settings, self.learning, lambda: self._startup.loading),
        )
        self._registry_listeners: list[RegistryListener] = []
        self._shortlist_listeners: list[ShortlistListener] = []
        self._thread: threading.Thread | None = None
        self._startup = Startup(  # the start-up sequence (registry.startup) and what it builds
            settings,
            self.store,
            embedder_factory,
            self.bor_policy,
            self.learning,
            self.policies,
            self.feedback_recorder,
            self.write_jobs,
            on_change=self._notify,
            wrap_write=self._notifying,
        )
        self.feedback_recorder.losses = self._startup.shortlist_losses
        self.add_feedback_listener(self._learn)
        self._registry_listeners.append(self._learning_registry_changed)

    @classmethod
    def from_settings(
        cls,
        settings: Settings | None = None,
        *,
        embedder_factory: EmbedderFactory = default_embedder,
        bor_policy: TunableDepthPolicy | None = None,
        store: Store | None = None,
        start: bool = False,
    ) -> Shortlister:
        """A core for ``settings`` (default: the environment's); ``start`` loads it inline."""
        core = cls(
            settings or Settings(),
            embedder_factory=embedder_factory,
            bor_policy=bor_policy,
            store=store,
        )
        if start:
            core.start(background=False)
        return core

    # -- listeners ------------------------------------------------------------------------------

    def add_registry_listener(self, listener: RegistryListener) -> None:
        """Called with every registry installed at load, written here, or synced from elsewhere
        (``change.info`` None: deleted). Add listeners before :meth:`start`."""
        self._registry_listeners.append(listener)

    def add_shortlist_listener(self, listener: ShortlistListener) -> None:
        """Called with every shortlist served (on the serving thread; keep it cheap)."""
        self._shortlist_listeners.append(listener)

    def add_feedback_listener(self, listener: FeedbackListener) -> None:
        """Called with every newly recorded feedback event (not resends, not restored ones)."""
        self.feedback_recorder.add_listener(listener)

    def _changed(self, info: RegistryInfo) -> RegistryInfo:
        self._notify(RegistryChange(info.registry, info))
        return info

    def _notify(self, change: RegistryChange) -> None:
        for listener in self._registry_listeners:
            listener(change)

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def engine(self) -> ShortlistEngine | None:
        """The loaded engine (None while loading, or when loading failed)."""
        return self._startup.engine

    def store_warnings(self) -> list[str]:
        """What the store found damaged and is serving around (a newest version file that
        cannot be read: the version before it is served), one line each, no absolute paths."""
        if not isinstance(self.store, ReportsDamage):
            return []
        return [
            f"registry {name!r}: newest version file {file} is damaged and skipped (the version "
            "before it, if any, is served; the next write gets a number above it)"
            for name, file in sorted(self.store.damaged().items())
        ]

    @property
    def load_error(self) -> str | None:
        """Why the core is not ready (a failure, or a store it is still waiting for)."""
        return self._startup.load_error

    @property
    def query_cache(self) -> CachedEmbedder | None:
        """The query-embedding cache, once loaded with ``query_cache_size`` > 0."""
        return self._startup.query_cache

    @property
    def sync(self) -> StoreSync | None:
        """The thread keeping a replica in step with a shared store (None: local store)."""
        return self._startup.sync

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def start(self, background: bool = True) -> None:
        """Load the embedder and every registry; in a thread so a face answers health meanwhile."""
        if background:
            self._thread = threading.Thread(target=self._startup.run, name="shortlist-loader", daemon=True)
            self._thread.start()
        else:
            self._startup.run()

    def wait_ready(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.ready

    def close(self) -> None:
        """Stop the sync thread, wait for a running feedback compaction, then release store
        connections (at shutdown). The local feedback log stays open: an app's lifespan may
        start the same core again (the API fuzz test does)."""
        self._startup.closing.set()
        if self.sync is not None:
            self.sync.stop()
        # before the learner (its checkpoint) and the log and store a compaction writes to
        self.feedback_recorder.close()
        self.policies.close()
        self.write_jobs.close()
        self.learning.close()
        if self.engine is not None:
            self.feedback_recorder.save_pending(self._startup.pending_path)
        if isinstance(self.store, SharedStore):
            self.store.close()

    def require_engine(self) -> ShortlistEngine:
        """The loaded engine.

        Raises:
            NotReady: still loading, or loading failed (the message says why).
        """
        if self.engine is None:
            reason = self.load_error or "models and registries are still loading"
            raise NotReady(f"service not ready: {reason}")
        return self.engine

    # -- queries and feedback -------------------------------------------------------------------

    def shortlist(
        self,
        request: ShortlistRequest,
        *,
        caller: str | None = None,
        token_scope: Sequence[str] | None = None,
    ) -> Shortlist:
        """Shortlist for ``request`` (see :meth:`ShortlistEngine.shortlist`) and remember it, so
        feedback can quote its ``shortlist_id``. ``caller``: a hash of the bearer token that
        asked (None without tokens), logged for the learning loop. ``token_scope``: the tool
        patterns bound to that token (None: unbound), which the request can only narrow.

        A shortlist of several ``queries`` is remembered without a query text: its feedback
        counts everywhere but in the usage memory (:mod:`registry.serving.batch`)."""
        result = self.require_engine().shortlist(request, token_scope)
        for listener in self._shortlist_listeners:
            listener(result)
        self.feedback_recorder.remember(result.shown(time.time(), request.query or "", caller))
        return result

    def feedback(self, request: FeedbackRequest, *, caller: str | None = None) -> FeedbackResult:
        """Record which tools the agent used for a served shortlist (a resend is not counted).

        The request is checked once, against the shortlist and the registry's current tools
        and equivalents; ``caller``: the hash of the token that sent it.

        Raises:
            ShortlistNotFound: unknown or expired id.
            ValidationFailed: bad names or calls; nothing is recorded.
        """
        engine = self.require_engine()

        def known_tools(registry: str) -> Collection[str]:
            snap = engine.current(registry)
            return snap.by_name if snap else ()

        def equivalence(registry: str) -> EquivalenceClasses:
            snap = engine.current(registry)
            return snap.equivalence if snap else EquivalenceClasses()

        event, resent = self.feedback_recorder.submit(
            request,
            known_tools=known_tools,
            equivalence=equivalence,
            caller=caller,
        )
        return FeedbackResult(event, resent)

    def report(self, registry: str) -> dict[str, Any]:
        """Tool efficiency from agents' feedback: per-tool utility and the tools worth pruning,
        and what the usage memory learned (``learning``)."""
        snap = self.require_engine().snapshot(registry)
        report = self.feedback_recorder.efficiency.report(
            registry,
            tools=list(snap.by_name),
            min_calls=self.settings.prune_min_calls,
            min_shown=self.settings.prune_min_shown,
        )
        return {**report, "learning": self.learning.report(registry)}

    # -- learning (registry.learning) -----------------------------------------------------------

    def learning_report(self, registry: str) -> dict[str, Any]:
        """The usage memory of a registry (raises RegistryNotFound)."""
        self.require_engine().snapshot(registry)
        return self.learning.report(registry)

    def set_learning(self, registry: str, enabled: bool) -> dict[str, Any]:
        """Switch learning on or off for one registry, on every replica (memory is kept)."""
        self.require_engine().snapshot(registry)
        return self.learning.set_enabled(registry, enabled)

    def wipe_learning(self, registry: str) -> dict[str, Any]:
        """Forget what a registry learned from feedback, on every replica."""
        self.require_engine().snapshot(registry)
        return self.learning.wipe(registry)

    def _learn(self, event: FeedbackEvent) -> None:
        self.learning.observe(event)

    def _learning_registry_changed(self, change: RegistryChange) -> None:
        tools = self.learning.known_tools(change.registry) if change.info is not None else None
        if change.info is None or tools is not None:
            self.learning.registry_changed(change.registry, tools)

    # -- registries -----------------------------------------------------------------------------

    def list_registries(self) -> list[RegistryInfo]:
        return self.require_engine().list_registries()

    def snapshot(self, registry: str) -> Snapshot:
        """The registry's current version (raises RegistryNotFound)."""
        return self.require_engine().snapshot(registry)

    def put_registry(self, registry: str, payload: Any) -> RegistryInfo:
        """Replace a registry's tools (creating it if needed); the version increases."""
        prepared = self.require_engine().prepare_put(registry, payload)
        self._overtake(registry)
        return self._changed(prepared.run())

    def upsert_tools(self, registry: str, payload: Any) -> RegistryInfo:
        """Add or replace tools by name, keeping the rest; creates the registry if missing."""
        prepared = self.require_engine().prepare_upsert(registry, payload)
        self._overtake(registry)
        return self._changed(prepared.run())

    def _overtake(self, registry: str, reason: str | None = None) -> int:
        """Supersede the registry's unfinished upload jobs: this write, acknowledged after
        them, must never be undone by one of them (:meth:`WriteJobs.supersede`)."""
        return self.write_jobs.supersede(registry, time.time(), reason or later_write(registry))

    def submit_write(self, kind: str, registry: str, payload: Any) -> RegistryInfo | WriteJob:
        """``put_registry`` (kind "put") or ``upsert_tools`` ("upsert"), validated now (errors
        raised before anything is accepted); with more than ``async_write_min_texts`` texts
        to embed, returns a :class:`WriteJob` running in the background instead of waiting."""
        engine = self.require_engine()
        prepare = engine.prepare_put if kind == "put" else engine.prepare_upsert
        prepared: PreparedWrite = prepare(registry, payload)
        limit = self.settings.async_write_min_texts
        prepared = self._notifying(prepared)
        if limit and prepared.new_texts > limit and prepared.uncached() > limit:
            return self.write_jobs.submit(prepared, kind, payload)
        self._overtake(registry)
        info: RegistryInfo = prepared.run()
        return info

    def _notifying(self, prepared: PreparedWrite) -> PreparedWrite:
        """``prepared`` telling the registry listeners about the version it commits."""
        run = prepared.apply
        prepared.apply = lambda: self._changed(run())
        return prepared

    def write_job(self, registry: str, job_id: str) -> WriteJob | None:
        """A job :meth:`submit_write` accepted (here, before a restart, or on another replica
        sharing the Redis); None: unknown or expired (finished jobs are kept a day)."""
        return self.write_jobs.get(registry, job_id)

    def graph(self, registry: str) -> dict[str, Any]:
        """The registry's prerequisite graph (its edges and the admins' edits) and the companions
        learned from feedback (``learned``, each with its evidence).

        Raises:
            RegistryNotFound: unknown registry.
        """
        snap = self.snapshot(registry)
        return {"registry": snap.registry, "version": snap.version, **snap.graph.to_json(),
                "learned": self.learning.learned_edges(snap)}

    def edit_graph(self, registry: str, add: Any = None, remove: Any = None) -> RegistryInfo:
        """Add or remove prerequisite edges ``[[provider, consumer], ...]``; the version
        increases (unknown tool names: ``ValidationFailed`` naming them, nothing changed)."""
        return self._changed(self.require_engine().edit_graph(registry, add, remove))

    def delete_tool(self, registry: str, name: str) -> RegistryInfo:
        """Remove one tool; the version increases."""
        engine = self.require_engine()
        if name in engine.snapshot(registry).by_name:  # a 404 supersedes nothing
            self._overtake(registry)
        return self._changed(engine.delete_tool(registry, name))

    def delete_registry(self, registry: str) -> None:
        """Delete a registry and all its versions, and supersede its unfinished upload jobs
        (a registry that exists only as a queued upload is deleted by cancelling it).

        Raises:
            RegistryNotFound: no such registry and no upload of it queued.
        """
        engine = self.require_engine()
        validate_registry_name(registry)
        cancelled = self._overtake(registry, deleted(registry))
        try:
            engine.delete_registry(registry)
        except RegistryNotFound:
            if not cancelled:
                raise
        self._notify(RegistryChange(registry, None))
        self.policies.forget(registry)
