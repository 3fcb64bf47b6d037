"""Bringing the core up: the start-up sequence of :class:`registry.core.Shortlister`, in order.

:meth:`Startup.run` runs on the core's loader thread (or inline) and, step by step:

1. builds the embedder (behind the query cache when it is on) and the engine;
2. arms the wipe recovery: from here on a shared store that lost its data is refilled from
   this replica, not mirrored (:func:`registry.writes.sync.republish_from`);
3. loads every stored registry, then the demo registry when configured;
4. restores what feedback needs: the shortlists a graceful shutdown saved (local mode) and the
   feedback log, compacting it when due;
5. starts the usage memory (registry.learning) on the loaded engine;
6. tells the registry listeners, starts the replica sync (shared store) and the policy poll,
   publishes the engine (the core is ready), and resumes unfinished background jobs.

While the shared store is unreachable each step is retried, and ``load_error`` says so; any
other failure ends the sequence with ``load_error`` set, and the core keeps answering health
checks. :meth:`Startup.write_back_after_wipe` is the recovery step 2 arms. The core hands over
its parts and callbacks; this module never imports it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from registry.backends import HoldsBackWrites, start_learner
from registry.errors import ShortlistError, StoreUnavailable
from registry.feedback import FeedbackRecorder
from registry.index.embed import Embedder
from registry.index.query_cache import CachedEmbedder
from registry.learning.learner import UsageLearner
from registry.learning.manager import PolicyManager
from registry.serving.depth_policies import TunableDepthPolicy
from registry.settings import EmbedderArgs, Settings
from registry.store.base import SharedStore, Store, WipeableStore
from registry.tools import ToolLimits, parse_tools
from registry.writes.engine import RegistryChange, ShortlistEngine
from registry.writes.jobs import PreparedWrite
from registry.writes.sync import StoreSync, republish_from
from registry.writes.write_jobs import WriteJobs

log = logging.getLogger(__name__)

__all__ = ["DEMO_REGISTRY", "Startup"]

DEMO_REGISTRY = "demo"
T = TypeVar("T")


@dataclass(eq=False)
class Startup:
    """The start-up sequence and what it produces (``engine``, ``sync``, ``query_cache``)."""

    settings: Settings
    store: Store
    embedder_factory: Callable[[EmbedderArgs], Embedder]
    bor_policy: TunableDepthPolicy
    learning: UsageLearner
    policies: PolicyManager
    feedback_recorder: FeedbackRecorder
    write_jobs: WriteJobs
    on_change: Callable[[RegistryChange], None]  # every registry change, to the core's listeners
    wrap_write: Callable[[PreparedWrite], PreparedWrite]  # a resumed write job's notification
    closing: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.time)
    engine: ShortlistEngine | None = None  # set when the core is ready
    loading: ShortlistEngine | None = None  # the engine from the learner's start on
    sync: StoreSync | None = None
    query_cache: CachedEmbedder | None = None
    load_error: str | None = None
    losses: list[tuple[float, str]] = field(default_factory=list)  # what lost pending shortlists

    @property
    def pending_path(self) -> Path:
        """Where a graceful shutdown saves the shortlists still awaiting feedback (local mode)."""
        return Path(self.settings.data_dir) / "feedback" / "pending-shortlists.jsonl"

    def run(self) -> None:
        """The start-up sequence (module docstring)."""
        try:
            self._run()
        except ShortlistError as exc:
            self.load_error = exc.message
            log.error("start-up failed: %s", exc.message)
        except Exception as exc:  # keep answering health checks; readiness reports the failure
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("start-up failed")

    def _until_store_answers(self, step: Callable[[], T]) -> T:
        """Run a step, retrying while the shared store is unreachable (not ready yet)."""
        while True:
            try:
                result = step()
            except StoreUnavailable as exc:
                if self.closing.is_set():
                    raise
                self.load_error = f"{exc.message} (retrying)"
                self.closing.wait(self.settings.sync_interval_seconds)
                continue
            self.load_error = None
            return result

    def _run(self) -> None:
        settings, recorder, store = self.settings, self.feedback_recorder, self.store
        embedder = self.embedder_factory(EmbedderArgs.of(settings))
        if settings.query_cache_size > 0:
            embedder = self.query_cache = CachedEmbedder(embedder, settings.query_cache_size)
        engine = ShortlistEngine(
            settings, store, embedder, self.bor_policy, usage=self.learning, policy_book=self.policies.book
        )
        # before the first store call: a store wiped from here on is refilled, not mirrored
        republish_from(engine, store, recorder, self.write_back_after_wipe)
        log.info("loaded %d registries", self._until_store_answers(engine.load_all))
        self._until_store_answers(lambda: self._load_demo(engine))
        self._restore_pending(engine)
        log.info("restored %d feedback events from the log", self._until_store_answers(recorder.restore))
        recorder.maybe_compact()
        self.loading = engine
        self._until_store_answers(lambda: start_learner(
            self.learning, engine, embedder, recorder.log, store, key_prefix=settings.redis_key_prefix()
        ))
        for info in engine.list_registries():
            self.on_change(RegistryChange(info.registry, info))
        if isinstance(store, SharedStore):
            engine.add_listener(self.on_change)
            memory = recorder.memory
            self.sync = StoreSync(
                engine,
                store,
                interval=settings.sync_interval_seconds,
                feedback=recorder,
                on_tick=memory.flush_pending if isinstance(memory, HoldsBackWrites) else None,
                learned=self.write_back_after_wipe,
            )
        self.policies.start(settings.sync_interval_seconds if isinstance(store, SharedStore) else None)
        self.engine = engine
        resumed = self._until_store_answers(lambda: self.write_jobs.resume(engine, self.wrap_write))
        resumed += self._until_store_answers(self.policies.resume)
        if resumed:
            log.warning("%d unfinished background jobs resumed after a restart", resumed)
        if self.sync is not None and not self.closing.is_set():
            self.sync.start()

    def shortlist_losses(self) -> list[tuple[float, str]]:
        """What lost remembered shortlists, and when: an unclean restart, a wiped shared store."""
        if not isinstance(self.store, WipeableStore):
            return list(self.losses)
        wipes = [(r.at, "the shared store (Redis) lost its data") for r in self.store.epoch.recoveries]
        return [*self.losses, *wipes]

    def write_back_after_wipe(self, won: bool) -> None:
        """The shared store lost its data: every replica writes back the jobs it holds; the
        winner what the learning loop holds (policy versions, usage memories and switches), as
        it does the registries."""
        try:  # every replica: the jobs it holds (so their polls keep answering)
            self.write_jobs.queue.republish()
            self.policies.queue.republish()
        except ShortlistError as exc:
            log.warning("background jobs not written back: %s", exc.message)
        if not won:
            return
        try:
            self.policies.book.write_back()
            saved = self.learning.write_back()
            log.warning("wrote %d usage memories back to the shared store", saved)
        except ShortlistError as exc:  # retried: the policy poll and the next saves write again
            log.warning("learning state not written back yet: %s", exc.message)

    def _restore_pending(self, engine: ShortlistEngine) -> None:
        """Local mode: take back the shortlists a graceful shutdown saved; after any other
        stop, feedback for one served before this start gets 410 saying why."""
        if not self.feedback_recorder.restore_pending(self.pending_path) and engine.list_registries():
            self.losses.append(
                (self.started, "the service restarted without a graceful shutdown (pending "
                 "shortlists are kept across a graceful one only)")
            )

    def _load_demo(self, engine: ShortlistEngine) -> None:
        path: Path | None = self.settings.demo_registry
        if path is None or engine.has_registry(DEMO_REGISTRY):
            return
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
        parse_tools(payload, ToolLimits())  # fail on a broken demo file before writing anything
        info = engine.create_registry(DEMO_REGISTRY, payload)  # replicas racing: one creates it
        if info is not None:
            log.info("loaded demo registry from %s (%d tools)", path, info.tools)
