"""Bringing the core up: the loading sequence of :class:`registry.core.Shortlister`, in order.

Every part is built beforehand by :func:`registry.assembly.assemble`; start-up only loads.
:meth:`Startup.run` runs on the core's loader thread (or inline) and, step by step:

1. loads the embedder (behind the query cache when it is on) into the handle every part holds,
   and the relevance model ``allow_empty`` reads;
2. loads every stored registry into the snapshot map, then the demo registry when configured;
3. restores what feedback needs: the shortlists a graceful shutdown saved (local mode) and the
   feedback log, compacting it when due;
4. starts the usage memory (registry.learning) on the loaded registries;
5. tells the registry listeners, and (shared store) subscribes them to what other replicas
   write; starts the policy poll; marks the core ready, resumes unfinished background jobs
   and starts the replica sync.

While the shared store is unreachable each step is retried, and ``load_error`` says so; any
other failure ends the sequence with ``load_error`` set, and the core keeps answering health
checks. A shared store that loses its data from assembly on is refilled from this replica, not
mirrored (:func:`registry.writes.sync.republish_from`, armed when the sync is built), and
:class:`WriteBackAfterWipe` is what the learning loop and the job queues write back then.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from registry.errors import ShortlistError, StoreUnavailable
from registry.feedback import FeedbackRecorder, LogCompacted
from registry.index.embedder_handle import EmbedderHandle
from registry.learning.learner import UsageLearner
from registry.learning.manager import PolicyManager
from registry.learning.usage import UsageEvent
from registry.serving.coverage import CoverageFile
from registry.serving.relevance import RelevanceFile
from registry.settings import Settings
from registry.snapshots import RegistryChange
from registry.store.base import Store, WipeableStore
from registry.store.stores import Stores
from registry.tools import ToolLimits, parse_tools
from registry.writes.prepared import PreparedWrite
from registry.writes.sync import StoreSync
from registry.writes.write_jobs import WriteJobs
from registry.writes.writer import RegistryWriter

log = logging.getLogger(__name__)

__all__ = ["DEMO_REGISTRY", "ShortlistLosses", "Startup", "WriteBackAfterWipe"]

DEMO_REGISTRY = "demo"
T = TypeVar("T")


class ShortlistLosses:
    """What lost remembered shortlists, and when: an unclean restart (start-up adds it), a
    wiped shared store (its epoch's recoveries). The feedback recorder asks, so feedback for a
    shortlist served before gets 410 saying why, not 404."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._found: list[tuple[float, str]] = []

    def add(self, at: float, why: str) -> None:
        self._found.append((at, why))

    def __call__(self) -> list[tuple[float, str]]:
        if not isinstance(self._store, WipeableStore):
            return list(self._found)
        wipes = [(r.at, "the shared store (Redis) lost its data") for r in self._store.epoch.recoveries]
        return [*self._found, *wipes]


@dataclass(frozen=True, slots=True)
class WriteBackAfterWipe:
    """The shared store lost its data: every replica writes back the jobs it holds; the winner
    what the learning loop holds (policy versions, usage memories and switches), as it does the
    registries. Called with whether this replica won."""

    write_jobs: WriteJobs
    policies: PolicyManager
    learner: UsageLearner

    def __call__(self, won: bool) -> None:
        try:  # every replica: the jobs it holds (so their polls keep answering)
            self.write_jobs.queue.republish()
            self.policies.queue.republish()
        except ShortlistError as exc:
            log.warning("background jobs not written back: %s", exc.message)
        if not won:
            return
        try:
            self.policies.book.write_back()
            saved = self.learner.write_back()
            log.warning("wrote %d usage memories back to the shared store", saved)
        except ShortlistError as exc:  # retried: the policy poll and the next saves write again
            log.warning("learning state not written back yet: %s", exc.message)


@dataclass(eq=False)
class Startup:
    """The loading sequence over assembled parts, and its outcome (``ready``, ``load_error``)."""

    settings: Settings
    stores: Stores
    embedder: EmbedderHandle
    relevance: RelevanceFile
    coverage: CoverageFile
    writer: RegistryWriter
    learner: UsageLearner
    policies: PolicyManager
    recorder: FeedbackRecorder
    write_jobs: WriteJobs
    sync: StoreSync | None  # shared store: the replica sync, started last
    losses: ShortlistLosses
    on_change: Callable[[RegistryChange], None]  # every registry change, to the core's listeners
    wrap_write: Callable[[PreparedWrite], PreparedWrite]  # a resumed write job's notification
    closing: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.time)
    ready: bool = False
    load_error: str | None = None

    @property
    def pending_path(self) -> Path:
        """Where a graceful shutdown saves the shortlists still awaiting feedback (local mode)."""
        return Path(self.settings.data_dir) / "feedback" / "pending-shortlists.jsonl"

    def run(self) -> None:
        """The loading sequence (module docstring)."""
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
        recorder, writer = self.recorder, self.writer
        self.embedder.load()
        self.relevance.load()
        self.coverage.load()
        log.info("loaded %d registries", self._until_store_answers(writer.load_all))
        self._until_store_answers(self._load_demo)
        self._restore_pending()
        log.info("restored %d feedback events from the log", self._until_store_answers(recorder.restore))
        recorder.maybe_compact()
        self._until_store_answers(self._start_learner)
        for info in writer.snapshots.list_registries():
            self.on_change(RegistryChange(info.registry, info))
        if self.sync is not None:
            writer.add_listener(self.on_change)
        self.policies.start(self.settings.sync_interval_seconds if self.stores.shared else None)
        self.ready = True
        resumed = self._until_store_answers(lambda: self.write_jobs.resume(writer, self.wrap_write))
        resumed += self._until_store_answers(self.policies.resume)
        if resumed:
            log.warning("%d unfinished background jobs resumed after a restart", resumed)
        if self.sync is not None and not self.closing.is_set():
            self.sync.start()

    def _start_learner(self, background: bool = True) -> None:
        """Attach the learner to the loaded registries: restore saved memories, then fold the
        logged events after them (own log), or tail the shared log on the learner's thread."""
        learner, snapshots = self.learner, self.writer.snapshots
        registries = [info.registry for info in snapshots.list_registries()]
        open_reader = self.stores.log_reader
        if open_reader is None:
            backlog = self.recorder.log.replay()
            learner.attach(self.embedder.embed_query, registries, backlog=backlog, background=background)
            return
        reader = open_reader()

        def shared_events() -> Iterable[UsageEvent]:
            try:
                return reader.read_new(include_own=True)
            except LogCompacted:  # fell behind a compaction: the compactor's saved memories
                learner.restore_saved(info.registry for info in snapshots.list_registries())
                reader.rewind()  # then what is left (duplicates are skipped)
                return reader.read_new(include_own=True)

        learner.attach(self.embedder.embed_query, registries, source=shared_events, background=background)

    def _restore_pending(self) -> None:
        """Local mode: take back the shortlists a graceful shutdown saved; after any other
        stop, feedback for one served before this start gets 410 saying why."""
        if not self.recorder.restore_pending(self.pending_path) and len(self.writer.snapshots):
            self.losses.add(
                self.started, "the service restarted without a graceful shutdown (pending "
                "shortlists are kept across a graceful one only)"
            )

    def _load_demo(self) -> None:
        path: Path | None = self.settings.demo_registry
        if path is None or self.writer.snapshots.has_registry(DEMO_REGISTRY):
            return
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
        parse_tools(payload, ToolLimits())  # fail on a broken demo file before writing anything
        info = self.writer.create_registry(DEMO_REGISTRY, payload)  # replicas racing: one creates it
        if info is not None:
            log.info("loaded demo registry from %s (%d tools)", path, info.tools)
