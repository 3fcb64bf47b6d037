"""Feedback events in the shared Redis: one stream every replica reads (see
:mod:`registry.store.redis`)."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import suppress
from typing import Any, cast

import redis

from registry.feedback import (
    CHECKPOINT_FORMAT,
    FeedbackEvent,
    LogCompacted,
    ToolEfficiency,
    parse_checkpoint,
)
from registry.store.redis_base import FEEDBACK_DOWN, RedisBase, StoreHealth

log = logging.getLogger(__name__)

_COMPACT_LOCK_MS = 120_000
_RELEASE_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


_CHECKPOINT_IF_NONE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""


def _stream_id(entry_id: bytes | str) -> tuple[int, int]:
    ms, _, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).partition("-")
    return int(ms), int(seq or 0)


class RedisFeedbackLog(RedisBase):
    """Feedback events in a Redis Stream shared by every replica (a ``SharedFeedbackLog``).

    Each entry holds the event JSON and the id of the process that wrote it, so
    :meth:`read_new` can return only what *other* replicas recorded.

    Compaction keeps the stream bounded: :meth:`compact` (one replica at a time, under a lock
    key) folds the entries older than a cutoff into a checkpoint key (their tool-efficiency
    counts and the last stream id they cover), then trims them with ``XTRIM MINID``. Replays
    and reads start after the checkpoint's id, so a crash between the two steps counts
    nothing twice. A replica whose read position falls behind the checkpoint (it was cut off
    longer than the live window) gets :class:`~registry.feedback.LogCompacted` and resyncs.
    """

    def __init__(
        self, client: redis.Redis, prefix: str = "shortlist:", health: StoreHealth | None = None
    ) -> None:
        super().__init__(client, prefix, health)
        self.stream = self._key("feedback")
        self.checkpoint_key = self._key("feedback:checkpoint")
        self.checkpoint_id_key = self._key("feedback:checkpoint:last-id")  # read every tick
        self.lock_key = self._key("feedback:compacting")
        self.origin = uuid.uuid4().hex.encode()
        self._position: bytes | None = None  # None: start at the checkpoint
        self._read_lock = threading.Lock()
        self.skipped = 0

    def append(self, event: FeedbackEvent) -> None:
        line = json.dumps(event.to_json(), separators=(",", ":"), allow_nan=False)
        with self._call("append", FEEDBACK_DOWN):
            self.client.xadd(self.stream, {"event": line, "origin": self.origin})

    def _page(self, start: bytes, count: int, end: bytes | str = "+") -> list[tuple[bytes, dict[bytes, bytes]]]:
        with self._call("replay", FEEDBACK_DOWN):
            page = self.client.xrange(self.stream, min=start, max=end, count=count)
        return cast(list[tuple[bytes, dict[bytes, bytes]]], list(page or []))

    def _decode(self, entry_id: bytes, fields: dict[bytes, bytes]) -> FeedbackEvent | None:
        try:
            return FeedbackEvent.from_json(json.loads(fields[b"event"]))
        except (ValueError, KeyError, TypeError) as exc:
            self.skipped += 1
            log.warning("feedback stream %s: skipping entry %s: %s", self.stream, entry_id, exc)
            return None

    def _checkpoint(self) -> dict[str, Any] | None:
        with self._call("read checkpoint", FEEDBACK_DOWN):
            raw = self.client.get(self.checkpoint_key)
        if raw is None:
            return None
        return parse_checkpoint(
            raw, f"{self.checkpoint_key} in Redis", lambda doc: _stream_id(doc["last_id"]),
            {"key": self.checkpoint_key},
        )

    def _checkpoint_id(self) -> bytes | None:
        """The last stream id the checkpoint covers (a small key: no need to parse the counts)."""
        with self._call("read checkpoint", FEEDBACK_DOWN):
            raw = self.client.get(self.checkpoint_id_key)
        if raw is None:
            return None
        return raw if isinstance(raw, bytes) else raw.encode()

    def checkpoint_state(self) -> dict[str, Any] | None:
        doc = self._checkpoint()
        return None if doc is None else cast(dict[str, Any], doc["efficiency"])

    def pending_events(self) -> int:
        with self._call("length", FEEDBACK_DOWN):
            return int(self.client.xlen(self.stream))

    def pending_bytes(self) -> int:
        """Redis's estimate of the stream's memory (``MEMORY USAGE``, sampled: O(1))."""
        with self._call("length", FEEDBACK_DOWN):
            return int(self.client.memory_usage(self.stream, samples=5) or 0)

    def rewind(self) -> dict[str, Any] | None:
        with self._read_lock:
            doc = self._checkpoint()
            self._position = doc["last_id"].encode() if doc else b"0-0"
        return None if doc is None else cast(dict[str, Any], doc["efficiency"])

    def replay(self) -> Iterator[FeedbackEvent]:
        """Every event after the checkpoint (whose counts :meth:`checkpoint_state` gives)."""
        last = self._checkpoint_id()
        start = b"(" + last if last else b"-"
        while True:
            page = self._page(start, 1000)
            for entry_id, fields in page:
                event = self._decode(entry_id, fields)
                if event is not None:
                    yield event
            if len(page) < 1000:
                return
            start = b"(" + page[-1][0]

    def read_after(self, position: Any = None) -> tuple[list[FeedbackEvent], Any]:
        """Every replica's events after ``position`` (from a previous call; None: after the
        checkpoint), oldest first, and the position after them (see
        :meth:`registry.feedback.LocalFeedbackLog.read_after`).

        Raises:
            LogCompacted: the checkpoint moved since ``position`` was taken.
        """
        last = self._checkpoint_id()
        if position is not None and position[0] != (last.decode() if last else None):
            raise LogCompacted(f"feedback stream {self.stream} was compacted since the last read")
        after = position[1].encode() if position is not None and position[1] else last
        start = b"(" + after if after else b"-"
        events: list[FeedbackEvent] = []
        while True:
            page = self._page(start, 1000)
            for entry_id, fields in page:
                event = self._decode(entry_id, fields)
                if event is not None:
                    events.append(event)
                after = entry_id
            if len(page) < 1000:
                break
            start = b"(" + page[-1][0]
        return events, (last.decode() if last else None, after.decode() if after else None)

    def read_new(self, limit: int = 1000, *, include_own: bool = False) -> list[FeedbackEvent]:
        with self._read_lock:
            last = self._checkpoint_id()
            if self._position is None:
                self._position = last or b"0-0"
            elif last is not None and _stream_id(self._position) < _stream_id(last):
                raise LogCompacted(
                    f"feedback stream compacted up to {last.decode()}, this replica read up to "
                    f"{self._position.decode()}"
                )
            while True:
                page = self._page(b"(" + self._position, limit)
                if not page:
                    return []
                self._position = page[-1][0]
                events = []
                for entry_id, fields in page:
                    if not include_own and fields.get(b"origin") == self.origin:
                        continue  # counted when this process recorded it
                    event = self._decode(entry_id, fields)
                    if event is not None:
                        events.append(event)
                if events:
                    return events

    def republish_checkpoint(self, efficiency: dict[str, Any]) -> bool:
        """After the store lost its data: make ``efficiency`` (this replica's counts, caught up
        to its read position) the checkpoint, covering the stream up to that position. Only
        if no checkpoint exists: the first replica to re-publish wins, the others resync from it.

        Returns:
            Whether this call wrote the checkpoint.
        """
        with self._read_lock:
            last = (self._position or b"0-0").decode()
            checkpoint = {
                "format": CHECKPOINT_FORMAT,
                "last_id": last,
                "events_folded": 0,
                "republished": True,
                "efficiency": efficiency,
            }
            with self._call("republish checkpoint", FEEDBACK_DOWN):
                written = self.client.eval(
                    _CHECKPOINT_IF_NONE, 2, self.checkpoint_key, self.checkpoint_id_key,
                    json.dumps(checkpoint, separators=(",", ":")), last,
                )
        return bool(written)

    def compact(self, cutoff: float) -> int:
        """Fold the entries added before ``cutoff`` (epoch seconds, compared with the stream
        ids, which are Redis server milliseconds) into the checkpoint, then trim them.

        Returns:
            The number of entries folded (0 when another replica is compacting or none is older).

        Raises:
            StoreUnavailable: Redis cannot be reached (nothing half-done is left behind).
        """
        token = uuid.uuid4().hex
        with self._call("compact", FEEDBACK_DOWN):
            if not self.client.set(self.lock_key, token, nx=True, px=_COMPACT_LOCK_MS):
                return 0
        try:
            doc = self._checkpoint()
            counts = ToolEfficiency.from_state(doc["efficiency"] if doc else {})
            last = doc["last_id"].encode() if doc else None
            end = f"{max(int(cutoff * 1000) - 1, 0)}-18446744073709551615"
            start = b"(" + last if last else b"-"
            folded = 0
            while True:
                page = self._page(start, 1000, end)
                for entry_id, fields in page:
                    event = self._decode(entry_id, fields)
                    if event is not None:
                        counts.add(event)
                        folded += 1
                    last = entry_id
                if len(page) < 1000:
                    break
                start = b"(" + page[-1][0]
            if last is None or (doc and last.decode() == doc["last_id"]):
                return 0
            checkpoint = {
                "format": CHECKPOINT_FORMAT,
                "last_id": last.decode(),
                "events_folded": int((doc or {}).get("events_folded", 0)) + folded,
                "efficiency": counts.to_state(),
            }
            ms, seq = _stream_id(last)
            with self._call("compact", FEEDBACK_DOWN):
                # the checkpoint first: a crash before the trim leaves entries it already counts,
                # and every reader starts after its last_id
                self.client.mset({self.checkpoint_key: json.dumps(checkpoint, separators=(",", ":")),
                                  self.checkpoint_id_key: last})  # one atomic write
                self.client.xtrim(self.stream, minid=f"{ms}-{seq + 1}", approximate=False)
            log.info("feedback stream %s: compacted %d entries up to %s", self.stream, folded, last.decode())
            return folded
        finally:
            with suppress(redis.exceptions.RedisError):  # the lock expires on its own
                self._release_lock(token)

    def _release_lock(self, token: str) -> None:
        self.client.eval(_RELEASE_LOCK, 1, self.lock_key, token)
