"""The Shortlister: the one core every face (HTTP, MCP, CLI, in-process users) calls.

Built from settings alone: :func:`registry.assembly.assemble` builds its parts (stores,
embedder, the snapshot map, the query runner and the writer over it, feedback, learning,
policies, sync) and the core only uses them::

    shortlist(request)   the runner (registry.serving.shortlist.QueryRunner) applied to the
                         registry's current snapshot and the resolved request, then remembered
    feedback(...)        checked against the registry's current tools, recorded, learned from
    admin writes         the writer (registry.writes.writer.RegistryWriter), then listeners told

Loading (the embedder, every registry, the demo registry) runs in the background, so a face can
answer health checks meanwhile: :class:`registry.startup.Startup`.

Faces observe the core through listeners (registry changes, served shortlists, feedback
events), e.g. to export metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from registry.assembly import EmbedderFactory, Parts, assemble
from registry.errors import NotReady, RegistryNotFound
from registry.feedback import EquivalenceClasses, FeedbackEvent, FeedbackListener, FeedbackRequest
from registry.index.query_cache import CachedEmbedder
from registry.index.snapshot import Snapshot
from registry.name_checks import validate_registry_name
from registry.request import ShortlistRequest
from registry.serving.depth_policies import TunableDepthPolicy
from registry.serving.result import Shortlist
from registry.settings import Settings
from registry.snapshots import RegistryChange, RegistryInfo, RegistryListener
from registry.startup import DEMO_REGISTRY
from registry.store.base import ReportsDamage, SharedStore, Store
from registry.writes.prepared import PreparedWrite
from registry.writes.sync import StoreSync
from registry.writes.write_jobs import WriteJob, deleted, later_write

log = logging.getLogger(__name__)

__all__ = [
    "DEMO_REGISTRY",
    "EmbedderFactory",
    "FeedbackResult",
    "RegistryListener",
    "ShortlistListener",
    "Shortlister",
]

ShortlistListener = Callable[[Shortlist], None]


@dataclass(frozen=True, slots=True)
class FeedbackResult:
    """What ``feedback()`` recorded; ``duplicate`` when the id already had feedback (not counted)."""

    event: FeedbackEvent
    duplicate: bool


class Shortlister:
    """The parts of :func:`registry.assembly.assemble` behind one object.

    Args:
        settings: everything; nothing else is read from the environment.
        embedder_factory: builds the embedder when loading starts (tests inject a fast one).
        bor_policy: the learned depth policy (default: the ONNX policy in ``policy_dir``,
            loaded at construction so a broken artifact fails before serving).
        store: a registry store to use instead of the one the settings choose.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        embedder_factory: EmbedderFactory | None = None,
        bor_policy: TunableDepthPolicy | None = None,
        store: Store | None = None,
    ) -> None:
        parts: Parts = assemble(settings, store=store, embedder_factory=embedder_factory, bor_policy=bor_policy)
        self.parts = parts
        self.settings = settings
        self.bor_policy = parts.bor_policy
        self.store: Store = parts.stores.registries
        self.store_health: Any = parts.stores.health  # registry.store.redis.StoreHealth in Redis mode
        self.caller_key: Callable[[], bytes] = parts.stores.caller_key  # the faces key caller hashes with it
        self.job_records = parts.stores.job_records
        self.write_jobs = parts.write_jobs
        self.snapshots = parts.snapshots  # read by queries, installed into by the writer
        self.queries = parts.queries
        self.writer = parts.writer
        self.window = parts.window
        self.learning = parts.learner  # usage memory (registry.learning): lifts rankings
        self.feedback_recorder = parts.recorder
        self.policies = parts.policies  # per-registry depth policies: versions, refits, hot swaps
        self._startup = parts.startup
        self._listeners = parts.listeners
        self._shortlist_listeners: list[ShortlistListener] = []
        self._thread: threading.Thread | None = None
        self.add_feedback_listener(self._learn)
        self._listeners.add(self._learning_registry_changed)

    @classmethod
    def from_settings(
        cls,
        settings: Settings | None = None,
        *,
        embedder_factory: EmbedderFactory | None = None,
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
        self._listeners.add(listener)

    def add_shortlist_listener(self, listener: ShortlistListener) -> None:
        """Called with every shortlist served (on the serving thread; keep it cheap)."""
        self._shortlist_listeners.append(listener)

    def add_feedback_listener(self, listener: FeedbackListener) -> None:
        """Called with every newly recorded feedback event (not resends, not restored ones)."""
        self.feedback_recorder.add_listener(listener)

    def _changed(self, info: RegistryInfo) -> RegistryInfo:
        self._listeners(RegistryChange(info.registry, info))
        return info

    # -- lifecycle ------------------------------------------------------------------------------

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
        return self.parts.embedder.query_cache

    @property
    def sync(self) -> StoreSync | None:
        """The thread keeping a replica in step with a shared store (None: local store)."""
        return self.parts.sync

    @property
    def ready(self) -> bool:
        """Loaded: the embedder and every registry (queries and writes are answered)."""
        return self._startup.ready

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
        if self.ready:
            self.feedback_recorder.save_pending(self._startup.pending_path)
        if isinstance(self.store, SharedStore):
            self.store.close()

    def require_ready(self) -> None:
        """Raises NotReady while loading, or when loading failed (the message says why)."""
        if not self.ready:
            reason = self.load_error or "models and registries are still loading"
            raise NotReady(f"service not ready: {reason}")

    # -- queries and feedback -------------------------------------------------------------------

    def shortlist(
        self,
        request: ShortlistRequest,
        *,
        caller: str | None = None,
        token_scope: Sequence[str] | None = None,
    ) -> Shortlist:
        """Rank the registry's tools for ``request`` and cut the list where the policy says; remember
        it, so feedback can quote its ``shortlist_id``.

        The request is checked first (every invalid field at once, see
        :meth:`~registry.request.ShortlistRequest.resolve`), then the registry's snapshot is read
        once and the runner answers on it (:meth:`registry.serving.shortlist.QueryRunner.run`). ``caller``: a hash of the bearer token that
        asked (None without tokens), logged for the learning loop. ``token_scope``: the tool
        patterns bound to that token (None: unbound), which the request can only narrow.

        A shortlist of several ``queries`` is remembered without a query text: its feedback
        counts everywhere but in the usage memory (:mod:`registry.serving.batch`)."""
        self.require_ready()
        resolved = request.resolve(self.settings, self.queries, token_scope)
        result = self.queries.run(self.snapshots.snapshot(request.registry), resolved)
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
        self.require_ready()
        snapshots = self.snapshots

        def known_tools(registry: str) -> Collection[str]:
            snap = snapshots.current(registry)
            return snap.by_name if snap else ()

        def equivalence(registry: str) -> EquivalenceClasses:
            snap = snapshots.current(registry)
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
        snap = self.snapshot(registry)
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
        self.snapshot(registry)
        return self.learning.report(registry)

    def set_learning(self, registry: str, enabled: bool) -> dict[str, Any]:
        """Switch learning on or off for one registry, on every replica (memory is kept)."""
        self.snapshot(registry)
        return self.learning.set_enabled(registry, enabled)

    def wipe_learning(self, registry: str) -> dict[str, Any]:
        """Forget what a registry learned from feedback, on every replica."""
        self.snapshot(registry)
        return self.learning.wipe(registry)

    def _learn(self, event: FeedbackEvent) -> None:
        self.learning.observe(event)

    def _learning_registry_changed(self, change: RegistryChange) -> None:
        tools = self.learning.known_tools(change.registry) if change.info is not None else None
        if change.info is None or tools is not None:
            self.learning.registry_changed(change.registry, tools)

    # -- registries -----------------------------------------------------------------------------

    def list_registries(self) -> list[RegistryInfo]:
        self.require_ready()
        return self.snapshots.list_registries()

    def snapshot(self, registry: str) -> Snapshot:
        """The registry's current version (raises RegistryNotFound)."""
        self.require_ready()
        return self.snapshots.snapshot(registry)

    def put_registry(self, registry: str, payload: Any) -> RegistryInfo:
        """Replace a registry's tools (creating it if needed); the version increases."""
        self.require_ready()
        prepared = self.writer.prepare_put(registry, payload)
        self._overtake(registry)
        return self._changed(prepared.run())

    def upsert_tools(self, registry: str, payload: Any) -> RegistryInfo:
        """Add or replace tools by name, keeping the rest; creates the registry if missing."""
        self.require_ready()
        prepared = self.writer.prepare_upsert(registry, payload)
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
        self.require_ready()
        prepare = self.writer.prepare_put if kind == "put" else self.writer.prepare_upsert
        prepared: PreparedWrite = prepare(registry, payload).announcing(self._listeners)
        limit = self.settings.async_write_min_texts
        if limit and prepared.new_texts > limit and prepared.uncached() > limit:
            return self.write_jobs.submit(prepared, kind, payload)
        self._overtake(registry)
        info: RegistryInfo = prepared.run()
        return info

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
        self.require_ready()
        return self._changed(self.writer.edit_graph(registry, add, remove))

    def delete_tool(self, registry: str, name: str) -> RegistryInfo:
        """Remove one tool; the version increases."""
        if name in self.snapshot(registry).by_name:  # a 404 supersedes nothing
            self._overtake(registry)
        return self._changed(self.writer.delete_tool(registry, name))

    def delete_registry(self, registry: str) -> None:
        """Delete a registry and all its versions, and supersede its unfinished upload jobs
        (a registry that exists only as a queued upload is deleted by cancelling it).

        Raises:
            RegistryNotFound: no such registry and no upload of it queued.
        """
        self.require_ready()
        validate_registry_name(registry)
        cancelled = self._overtake(registry, deleted(registry))
        try:
            self.writer.delete_registry(registry)
        except RegistryNotFound:
            if not cancelled:
                raise
        self._listeners(RegistryChange(registry, None))
        self.policies.forget(registry)
