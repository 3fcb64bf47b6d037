"""The feedback events refits read, kept per registry and read from the log incrementally.

A refit used to replay the whole feedback log (every registry's events, parsed again) to find
one registry's. This reader keeps the events per registry, and each refit first reads only
the lines appended since the previous one. A compaction that cut events (the log's replay no longer
yields them) makes it read the log again from its checkpoint, so a refit sees exactly what a
full replay would.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from registry.feedback import FeedbackEvent, FeedbackLog, LogCompacted

__all__ = ["RefitEvents"]

log = logging.getLogger(__name__)


class RefitEvents:
    """Per-registry events of ``feedback_log`` (one reader per process).

    ``reads`` counts the log lines parsed, ``rereads`` the full reads after a compaction.
    """

    def __init__(self, feedback_log: FeedbackLog) -> None:
        self.log = feedback_log
        self._by_registry: dict[str, list[FeedbackEvent]] = {}
        self._position: Any = None
        self._lock = threading.Lock()
        self.reads = 0
        self.rereads = 0

    def of(self, registry: str) -> list[FeedbackEvent]:
        """``registry``'s events, oldest first, up to what the log holds now."""
        read_after = self.log.read_after
        with self._lock:
            try:
                events, position = read_after(self._position)
            except LogCompacted:
                self._by_registry.clear()
                self.rereads += 1
                events, position = read_after(None)
            self._add(events)
            self._position = position
            return list(self._by_registry.get(registry, ()))

    def _add(self, events: Iterable[FeedbackEvent]) -> None:
        for event in events:
            self.reads += 1
            self._by_registry.setdefault(event.registry, []).append(event)
