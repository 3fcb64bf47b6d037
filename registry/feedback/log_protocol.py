"""What every durable feedback log offers (local JSON Lines, or a stream shared by replicas):
append and replay, compaction into a checkpoint, and, shared, reading what others appended."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast, runtime_checkable

from registry.errors import ArtifactError
from registry.feedback.counts import ToolEfficiency
from registry.feedback.events import FeedbackEvent

__all__ = [
    "CHECKPOINT_FORMAT",
    "CompactableFeedbackLog",
    "FeedbackLog",
    "LogCompacted",
    "SharedFeedbackLog",
    "parse_checkpoint",
]


@runtime_checkable
class FeedbackLog(Protocol):
    """Durable, append-only record of accepted feedback events."""

    def append(self, event: FeedbackEvent) -> None:
        """Store ``event``; it is durable when this returns."""
        ...

    def replay(self) -> Iterator[FeedbackEvent]:
        """Every stored event, oldest first."""
        ...

    def read_after(self, position: Any = None) -> tuple[list[FeedbackEvent], Any]:
        """The events after ``position`` (from a previous call; None: after the checkpoint),
        oldest first, and the position after them: a reader keeping up with the log reads
        each event once instead of replaying the whole log every time.

        Raises:
            LogCompacted: a compaction cut events since ``position`` was taken (read again
                from None).
        """
        ...


@runtime_checkable
class CompactableFeedbackLog(FeedbackLog, Protocol):
    """A log that folds old events into a checkpoint of their tool-efficiency counts.

    :meth:`replay` (and a shared log's reads) then yield only the events after the
    checkpoint; the counts of the folded ones come from :meth:`checkpoint_state`. Events stay
    in the log until they are older than the live window, so the window never needs them.
    """

    def checkpoint_state(self) -> dict[str, Any] | None:
        """Counts of the folded events (:meth:`ToolEfficiency.to_state`); ``None``: none folded."""
        ...

    def pending_events(self) -> int:
        """Events in the log after the checkpoint (what a restart replays)."""
        ...

    def pending_bytes(self) -> int:
        """Bytes those events take (compaction starts on bytes as well as on events)."""
        ...

    def compact(self, cutoff: float) -> int:
        """Fold the events received before ``cutoff`` (epoch seconds); returns how many."""
        ...


class LogCompacted(Exception):
    """A shared log was compacted past this reader's position: resynchronise from the checkpoint."""


@runtime_checkable
class SharedFeedbackLog(CompactableFeedbackLog, Protocol):
    """A log several replicas append to (``registry.store.redis.RedisFeedbackLog``)."""

    def read_new(self, limit: int = 1000, *, include_own: bool = False) -> list[FeedbackEvent]:
        """Up to ``limit`` events appended by *other* processes (every process with
        ``include_own``) since the previous call (since the checkpoint, on the first call or
        after :meth:`rewind`), oldest first; empty when caught up. The read position only
        advances when the read succeeds, so a failed call can simply be retried.

        Raises:
            LogCompacted: events past the read position were folded into the checkpoint.
        """
        ...

    def rewind(self) -> dict[str, Any] | None:
        """Move the read position to the checkpoint and return its counts (as
        :meth:`checkpoint_state`, read in the same step so the two agree)."""
        ...

    def republish_checkpoint(self, efficiency: dict[str, Any]) -> bool:
        """After the store lost its data: make ``efficiency`` (this replica's counts, caught up
        to its read position) the checkpoint, only if none exists; whether this call wrote it."""
        ...


CHECKPOINT_FORMAT = 1


def parse_checkpoint(
    raw: bytes | str, where: str, position: Callable[[dict[str, Any]], object], details: dict[str, Any]
) -> dict[str, Any]:
    """A validated compaction checkpoint: format, tool-efficiency state, and the log position
    it covers (``position`` reads it and raises on a bad one).

    Raises:
        ArtifactError: naming ``where``; counts built on a broken checkpoint would be wrong.
    """
    try:
        doc = json.loads(raw)
        if doc.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {CHECKPOINT_FORMAT}")
        ToolEfficiency.from_state(doc["efficiency"])
        position(doc)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArtifactError(f"feedback checkpoint {where} is unreadable: {exc}", details) from exc
    return cast(dict[str, Any], doc)
