"""Keeps one replica in step with a shared store: change notifications plus a periodic poll.

One background thread per process::

    loop:
        wait for a change notification, at most `interval` seconds   (pub/sub; wakes early)
        writer.refresh()         compare every registry's stored version with ours; rebuild the
                                 changed ones off the request path, swap them in; drop deleted
        feedback.catch_up()      count the feedback other replicas recorded
        feedback.maybe_compact() fold old feedback into the checkpoint (rarely; one replica)
        on error (store down):   mark the store down, wait `interval`, try again

A store that lost its data (a Redis flushed or restarted without persistence) is repopulated
from what the replicas hold instead of being mirrored (:func:`republish_from`, and
:mod:`registry.store.redis_epoch` for the protocol).

The notification makes replication fast (a write is served everywhere after one snapshot
build); the poll makes it certain (a notification lost while a connection was down is caught
at the next tick). During an outage the replica keeps serving its snapshots; the first
successful poll after it resynchronises everything, without a restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from registry.errors import StoreUnavailable
from registry.feedback import FeedbackRecorder
from registry.snapshots import Snapshots
from registry.store.base import RegistryRecord, SharedStore, Store, WipeableStore
from registry.writes.writer import RegistryWriter

log = logging.getLogger(__name__)

StatusListener = Callable[[bool], None]
_STOP_CHECK_SECONDS = 0.25  # how promptly stop() ends a long wait


def held_records(snapshots: Snapshots) -> list[RegistryRecord]:
    """Every registry version held in ``snapshots``, as the records that stored them."""
    records = []
    for info in snapshots.list_registries():
        snap = snapshots.current(info.registry)
        if snap is None:
            continue
        records.append(
            RegistryRecord(
                registry=snap.registry,
                version=snap.version,
                tools=[t.definition for t in snap.tools],
                equivalents=[list(g) for g in snap.equivalents],
                edges=snap.edits.to_json() if snap.edits else {},
                written_at=snap.written_at,
            )
        )
    return records


def republish_from(
    writer: RegistryWriter,
    store: Store,
    feedback: FeedbackRecorder | None = None,
    learned: Callable[[bool], None] | None = None,
) -> None:
    """Tell a store that can lose its data what to re-publish then: ``writer``'s registry
    versions, then (the winner) their embeddings, then ``feedback``'s counts, then ``learned``
    (called with whether this replica won: policy versions, usage memories) (a no-op for
    stores that cannot lose their data, e.g. local)."""
    if not isinstance(store, WipeableStore):
        return
    snapshots = writer.snapshots

    def after(won: bool) -> None:
        if won:  # the embedding cache too, so a replica started later embeds nothing again
            for info in snapshots.list_registries():
                snap = snapshots.current(info.registry)
                if snap is not None and len(snap.content_hashes) == len(snap.dense):
                    model_id = snap.embedder or writer.embedder.model_id
                    store.put_embeddings(model_id, dict(zip(snap.content_hashes, snap.dense.embeddings)))
        if feedback is not None:
            feedback.republish_counts()
        if learned is not None:
            learned(won)

    store.set_republish_source(
        lambda: held_records(snapshots),
        after,
        lambda: {info.registry: info.version for info in snapshots.list_registries()},
    )


class StoreSync:
    """The sync thread of one replica.

    Args:
        writer: the registries to keep in step (its store must be ``store``).
        store: the shared store.
        interval: poll period in seconds, and the pause after a failure.
        feedback: when given, its shared log is tailed on every tick.
        learned: called after a re-publish with whether this replica won (learning state, jobs).
        on_status: called with True/False when the store comes back / goes away.
        on_tick: called after every successful tick (e.g. to retry deferred work).
        settle_seconds: after a wipe this replica claims, how long writes wait for every
            replica to write back what it holds (default: ``max(5, 3 * interval + 2)``).
    """

    def __init__(
        self,
        writer: RegistryWriter,
        store: SharedStore,
        *,
        interval: float = 1.0,
        feedback: FeedbackRecorder | None = None,
        on_status: StatusListener | None = None,
        on_tick: Callable[[], None] | None = None,
        settle_seconds: float | None = None,
        learned: Callable[[bool], None] | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.writer = writer
        self.store = store
        self.interval = float(interval)
        self.feedback = feedback
        self._on_status = on_status
        self._on_tick = on_tick
        self.up = True
        self.ticks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        republish_from(writer, store, feedback, learned)
        if isinstance(store, WipeableStore):
            settle = settle_seconds if settle_seconds is not None else max(5.0, 3 * interval + 2)
            store.epoch.settle_ms = int(settle * 1000)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="shortlist-sync", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def tick(self) -> None:
        """One synchronisation pass (what the thread runs after every wake-up).

        Raises:
            StoreUnavailable: the store cannot be reached.
        """
        self.writer.refresh()
        if self.feedback is not None:
            self.feedback.catch_up()
            self.feedback.maybe_compact()
        if self._on_tick is not None:
            self._on_tick()
        self._set_up(True)
        self.ticks += 1

    def _wait(self) -> None:
        """Until a change notification, ``interval`` seconds, or stop(), whichever comes first."""
        deadline = time.monotonic() + self.interval
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self.store.wait_for_change(min(left, _STOP_CHECK_SECONDS)):
                return

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._wait()
                if self._stop.is_set():
                    return
                self.tick()
            except StoreUnavailable:
                self._set_up(False)
                self._stop.wait(self.interval)
            except Exception:  # a bug must not stop replication for good: log, pause, retry
                log.exception("store sync failed")
                self._stop.wait(self.interval)

    def _set_up(self, up: bool) -> None:
        if up == self.up:
            return
        self.up = up
        if up:
            log.info("store reachable again: registries resynchronised")
        else:
            log.warning("store unavailable: serving the registries in memory until it is back")
        if self._on_status is not None:
            self._on_status(up)
