"""Accepting feedback: validate, deduplicate, log durably, count; restore, compact, resync."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from registry.errors import ShortlistError, ShortlistExpired, ShortlistNotFound
from registry.feedback.counts import LiveWindow, ToolEfficiency
from registry.feedback.events import (
    EquivalenceClasses,
    FeedbackEvent,
    FeedbackRequest,
    RememberedShortlists,
    ShownShortlist,
    build_event,
    check_event_size,
)
from registry.feedback.log_protocol import (
    CompactableFeedbackLog,
    FeedbackLog,
    LogCompacted,
    SharedFeedbackLog,
)
from registry.feedback.served import ShortlistMemory, served_at

logger = logging.getLogger(__name__)

FeedbackListener = Callable[[FeedbackEvent], None]


class FeedbackRecorder:
    """Accepts feedback for served shortlists: validate, deduplicate, log durably, then count.

    Args:
        memory: served shortlists.
        log: durable event log.
        window: live presentation-rate window.
        efficiency: per-tool efficiency counts.
        clock: wall clock stamped on events; injectable for tests.
        on_event: listeners called with every newly recorded event (not resends, not
            :meth:`restore`), e.g. to bump Prometheus counters. A listener that raises is
            logged and ignored: the event is already recorded.
    """

    def __init__(
        self,
        memory: RememberedShortlists,
        log: FeedbackLog,
        window: LiveWindow,
        efficiency: ToolEfficiency,
        clock: Callable[[], float] = time.time,
        on_event: Iterable[FeedbackListener] = (),
        *,
        compact_after_events: int = 200_000,
        compact_after_bytes: int = 256 * 1024 * 1024,
        compact_margin_seconds: float = 600.0,
        min_compact_interval_seconds: float = 300.0,
        max_event_bytes: int = 256 * 1024,
        before_compact: Callable[[], bool] | None = None,
        losses: Callable[[], Iterable[tuple[float, str]]] = tuple,
    ) -> None:
        self.memory = memory
        self.log = log
        self.window = window
        self.efficiency = efficiency
        self._clock = clock
        self._listeners: list[FeedbackListener] = list(on_event)
        self.compact_after_events = int(compact_after_events)
        self.compact_after_bytes = int(compact_after_bytes)
        self.max_event_bytes = int(max_event_bytes)
        self.compact_margin_seconds = float(compact_margin_seconds)
        self.min_compact_interval_seconds = float(min_compact_interval_seconds)
        # Held across "append + count" and across a resynchronisation, so a shared log's
        # resync never counts one of this process's events twice (or misses one).
        self._count_lock = threading.Lock()
        self._compacting = threading.Lock()
        self._compactor: threading.Thread | None = None  # the last background compaction
        self._last_compact = -math.inf
        self.compactions = 0
        # (when, what) lost remembered shortlists: a restart without a graceful shutdown, a
        # wiped shared store; feedback for one served before gets 410, not 404
        self.losses = losses
        # Called before a compaction cuts events out of the log; False postpones it (the usage
        # learner saves the evidence it derived from them first: UsageLearner.checkpoint).
        self.before_compact = before_compact

    def add_listener(self, listener: FeedbackListener) -> None:
        self._listeners.append(listener)

    def remember(self, shortlist: ShownShortlist) -> None:
        """Remember a served shortlist so feedback can quote its id."""
        self.memory.remember(shortlist)

    def save_pending(self, path: Path) -> None:
        """At a graceful shutdown (local memory only): save the shortlists still waiting for
        feedback, so the next start takes feedback for them (:meth:`restore_pending`)."""
        if isinstance(self.memory, ShortlistMemory):
            try:
                logger.info("saved %d pending shortlists for the next start", self.memory.save(path))
            except OSError as exc:
                logger.warning("pending shortlists not saved (feedback for them gets 410): %s", exc)

    def restore_pending(self, path: Path) -> bool:
        """Take back what :meth:`save_pending` saved; False when nothing was saved (a shared
        memory keeps them itself: True)."""
        if not isinstance(self.memory, ShortlistMemory):
            return True
        restored = self.memory.load(path)
        if restored is not None:
            logger.info("restored %d pending shortlists saved at the last shutdown", restored)
        return restored is not None

    def _raise_lost(self, shortlist_id: str) -> None:
        """ShortlistExpired when ``shortlist_id`` was served, within its retention, before an
        event that lost the remembered shortlists."""
        at = served_at(shortlist_id)
        retention = self.memory.retention_seconds
        if at is None or self._clock() - at > retention:
            return
        for lost_at, why in sorted(self.losses()):
            if at < lost_at:
                raise ShortlistExpired(shortlist_id, at, lost_at, why)

    def submit(
        self,
        request: FeedbackRequest,
        *,
        known_tools: Callable[[str], Collection[str]],
        equivalence: Callable[[str], EquivalenceClasses],
        caller: str | None = None,
    ) -> tuple[FeedbackEvent, bool]:
        """Record the feedback ``request`` (for one served shortlist), validated here, once.

        Args:
            request: the report, as the face received it (checked by :func:`build_event`).
            known_tools: registry name -> its current tool names.
            equivalence: registry name -> its equivalence classes.
            caller: hash of the token that sent it (``None``: no tokens configured).

        Returns:
            ``(event, resent)``. On a resend (feedback already recorded for this id) the event
            is built from this request, and nothing is logged or counted.

        Raises:
            ShortlistNotFound: unknown or expired id.
            ValidationFailed: bad payload, or the event would take more than
                ``max_event_bytes`` in the log; nothing is recorded.
            StorageUnavailable: the durable append failed (StorageFull: no space left);
                nothing is counted and a retry is accepted.
        """
        shortlist_id = request.shortlist_id
        shortlist = self.memory.get(shortlist_id)
        if shortlist is None:
            self._raise_lost(shortlist_id)
            raise ShortlistNotFound(shortlist_id)
        event = build_event(
            shortlist,
            request.used,
            request.calls,
            request.success,
            known_tools(shortlist.registry),
            equivalence(shortlist.registry),
            self._clock(),
            caller,
        )
        check_event_size(event, self.max_event_bytes)  # a resend of a refused one is refused too
        if not self.memory.mark_feedback(shortlist_id):
            return event, True
        with self._count_lock:
            try:
                self.log.append(event)
            except BaseException:
                self.memory.unmark_feedback(shortlist_id)
                raise
            self._count(event)
        self.maybe_compact()
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("feedback listener %r failed", listener)
        return event, False

    def _count(self, event: FeedbackEvent) -> None:
        self.window.add(event)
        self.efficiency.add(event)

    def restore(self) -> int:
        """Replay the durable log into the counters (call once, at start-up, before serving).

        Every event goes into the efficiency counts; the window keeps those still inside it.
        Listeners are not called.

        Returns:
            The number of events replayed.
        """
        if isinstance(self.log, SharedFeedbackLog):
            self._load_checkpoint(self.log.rewind())
            return self.catch_up()  # resumable: a store outage mid-replay never double counts
        if isinstance(self.log, CompactableFeedbackLog):
            self._load_checkpoint(self.log.checkpoint_state())
        count = 0
        for event in self.log.replay():
            self._count(event)
            count += 1
        return count

    def _load_checkpoint(self, state: dict[str, Any] | None) -> None:
        self.efficiency.replace_with(ToolEfficiency.from_state(state or {}))

    def maybe_compact(self, *, wait: bool = False) -> bool:
        """Start a compaction of a compactable log when it holds more than
        ``compact_after_events`` events or ``compact_after_bytes`` bytes past its checkpoint
        (few large events fill a disk long before many small ones), at most once every
        ``min_compact_interval_seconds``. Runs on a background thread (``wait``: inline).

        Returns:
            Whether a compaction was started.
        """
        log = self.log
        if not isinstance(log, CompactableFeedbackLog):
            return False
        now = time.monotonic()
        if now - self._last_compact < self.min_compact_interval_seconds:
            return False
        try:
            if (
                log.pending_events() <= self.compact_after_events
                and log.pending_bytes() <= self.compact_after_bytes
            ):
                return False
        except ShortlistError:  # the shared store is down: try again later
            return False
        if not self._compacting.acquire(blocking=False):
            return False
        self._last_compact = now
        if wait:
            self._compact_now()
        else:
            self._compactor = threading.Thread(
                target=self._compact_now, name="feedback-compaction", daemon=True
            )
            self._compactor.start()
        return True

    def close(self, timeout: float = 60.0) -> None:
        """Wait for a running compaction (at shutdown, before the learner, log and store it uses
        are closed), so no compaction thread outlives the service and logs after its streams
        are closed. A later :meth:`maybe_compact` (the core started again) may start another.
        """
        if self._compacting.acquire(timeout=timeout):  # the running one holds it until it ends
            self._compacting.release()
        else:
            logger.warning("feedback compaction still running after %.0f s at shutdown", timeout)
        compactor = self._compactor
        if compactor is not None:
            compactor.join(timeout)

    def _compact_now(self) -> None:
        try:
            if self.before_compact is not None and not self.before_compact():
                logger.info("feedback compaction postponed: derived state is not saved yet")
                return
            cutoff = self._clock() - self.window.window_seconds - self.compact_margin_seconds
            folded = self.log.compact(cutoff)  # type: ignore[attr-defined]
            self.compactions += 1
            logger.info("feedback compaction folded %d events received before %.0f", folded, cutoff)
        except Exception:
            logger.exception("feedback compaction failed; the log is unchanged or consistent")
        finally:
            self._compacting.release()

    def catch_up(self) -> int:
        """Count the events other replicas appended to a shared log since the last call.

        Keeps the efficiency report and the live window the same on every replica. Listeners
        are not called: each replica's Prometheus counters count its own events, and PromQL
        sums them. A no-op (returns 0) for a log that is not shared.

        Raises:
            StoreUnavailable: the shared log cannot be read; call again later.
        """
        if not isinstance(self.log, SharedFeedbackLog):
            return 0
        count = 0
        try:
            while events := self.log.read_new():
                for event in events:
                    self._count(event)
                count += len(events)
        except LogCompacted:
            return self.resync()
        return count

    def republish_counts(self) -> bool:
        """After the shared store lost its data: count what is left of the shared log, then
        offer this replica's counts as its new checkpoint (``republish_checkpoint``), under the
        count lock so no own event is counted twice or missed. A no-op for other logs.

        Returns:
            Whether this replica's counts became the checkpoint.
        """
        log = self.log
        if not isinstance(log, SharedFeedbackLog):
            return False
        with self._count_lock:
            try:
                while events := log.read_new():
                    for event in events:
                        self._count(event)
            except LogCompacted:
                return False  # another replica re-published first: catch_up resyncs from it
            return bool(log.republish_checkpoint(self.efficiency.to_state()))

    def resync(self) -> int:
        """Rebuild the counts from a shared log's checkpoint and everything after it (this
        replica fell behind a compaction, e.g. through a long outage).

        Returns:
            The number of events read after the checkpoint.
        """
        log = self.log
        if not isinstance(log, SharedFeedbackLog):
            return 0
        with self._count_lock:  # no own event can be appended (and counted) meanwhile
            for attempt in range(3):
                try:
                    efficiency = ToolEfficiency.from_state(log.rewind() or {})
                    events: list[FeedbackEvent] = []
                    while page := log.read_new(include_own=True):
                        events += page
                    break
                except LogCompacted:  # compacted again while reading: start over
                    if attempt == 2:
                        raise
            self.window.clear()
            for event in events:
                self.window.add(event)
                efficiency.add(event)
            self.efficiency.replace_with(efficiency)
        logger.warning("feedback counts resynchronised from the checkpoint (%d events after it)", len(events))
        return len(events)
