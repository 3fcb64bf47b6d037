"""Served shortlists in the shared Redis, and the feedback marks that catch a resend (see
:mod:`registry.store.redis`)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

import redis

from registry.errors import ShortlistNotFound, StoreUnavailable
from registry.feedback import ShownShortlist
from registry.store.redis_base import FEEDBACK_DOWN, RedisBase, StoreHealth

log = logging.getLogger(__name__)

_MARK = """
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then
  return -1
end
if ttl < 1 then
  ttl = tonumber(ARGV[1])
end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ttl) then
  return 1
end
return 0
"""

class RedisShortlistMemory(RedisBase):
    """Served shortlists in Redis (``SET`` with a TTL of the retention period), so feedback may
    reach any replica. ``mark_feedback`` is a ``SET NX``: a resend is detected across replicas.

    During an outage :meth:`remember` is skipped (the shortlist is still served, but feedback
    on it will not be accepted) and the other methods raise ``StoreUnavailable``.

    Args:
        client: a client from :func:`connect`.
        retention_seconds: how long a shortlist accepts feedback.
        prefix: key prefix.
        health: shared outage flag.
        clock: wall clock (``ShownShortlist.created`` is wall-clock seconds).
    """

    def __init__(
        self,
        client: redis.Redis,
        retention_seconds: float,
        prefix: str = "shortlist:",
        health: StoreHealth | None = None,
        clock: Any = time.time,
        max_pending: int = 50_000,
    ) -> None:
        super().__init__(client, prefix, health)
        if not retention_seconds > 0:
            raise ValueError(f"retention_seconds must be > 0, got {retention_seconds}")
        self.retention_seconds = float(retention_seconds)
        self._clock = clock
        self._mark = client.register_script(_MARK)
        self._pending_unmarks: set[str] = set()
        # shortlists served while Redis was down, written once it is back (oldest dropped first)
        self._pending_shown: OrderedDict[str, ShownShortlist] = OrderedDict()
        self.max_pending = int(max_pending)
        self._lock = threading.Lock()
        self.dropped = 0  # shortlists never remembered: the outage buffer was full

    def _shown_key(self, shortlist_id: str) -> str:
        return self._key("shown", shortlist_id)

    def _mark_key(self, shortlist_id: str) -> str:
        return self._key("feedback-mark", shortlist_id)

    def _ttl_ms(self, shortlist: ShownShortlist) -> int:
        return int((self.retention_seconds - (self._clock() - shortlist.created)) * 1000)

    def _buffer(self, shortlist: ShownShortlist) -> None:
        with self._lock:
            self._pending_shown[shortlist.shortlist_id] = shortlist
            while len(self._pending_shown) > self.max_pending:
                self._pending_shown.popitem(last=False)
                self.dropped += 1

    @staticmethod
    def _record(shortlist: ShownShortlist) -> str:
        return json.dumps(shortlist.to_json(), separators=(",", ":"))

    def remember(self, shortlist: ShownShortlist) -> None:
        """Store a served shortlist for its retention. While Redis is down it is kept in memory
        (at most ``max_pending``) and written by :meth:`flush_pending` once Redis is back, so
        feedback on it still counts after the outage; the query path never waits for Redis."""
        ttl_ms = self._ttl_ms(shortlist)
        if ttl_ms <= 0:
            return
        if not self.health.up:
            self._buffer(shortlist)
            return
        try:
            with self._call("remember", FEEDBACK_DOWN):
                self.client.set(self._shown_key(shortlist.shortlist_id), self._record(shortlist), px=ttl_ms)
        except StoreUnavailable:
            self._buffer(shortlist)

    def get(self, shortlist_id: str) -> ShownShortlist | None:
        with self._lock:  # served during an outage and not written yet
            buffered = self._pending_shown.get(shortlist_id)
        if buffered is not None:
            return buffered if self._ttl_ms(buffered) > 0 else None
        with self._call("get", FEEDBACK_DOWN):
            raw = self.client.get(self._shown_key(shortlist_id))
        if raw is None:
            return None
        return ShownShortlist.from_json(json.loads(raw))

    def mark_feedback(self, shortlist_id: str) -> bool:
        self.flush_pending()
        with self._call("mark_feedback", FEEDBACK_DOWN):
            result = self._mark(
                keys=[self._shown_key(shortlist_id), self._mark_key(shortlist_id)],
                args=[int(self.retention_seconds * 1000)],
            )
        if int(result) < 0:
            raise ShortlistNotFound(shortlist_id)
        return int(result) == 1

    def unmark_feedback(self, shortlist_id: str) -> None:
        """Clear the mark; if Redis is down, clear it as soon as it is back (before any mark)."""
        try:
            with self._call("unmark_feedback", FEEDBACK_DOWN):
                self.client.delete(self._mark_key(shortlist_id))
        except StoreUnavailable:
            with self._lock:
                self._pending_unmarks.add(shortlist_id)

    def pending_shortlists(self) -> int:
        """Shortlists served during an outage and not yet written to Redis."""
        with self._lock:
            return len(self._pending_shown)

    def flush_pending(self) -> None:
        """Write what an outage held back: the unmarks that failed and the shortlists served
        meanwhile (expired ones are skipped). Raises while Redis is still down."""
        with self._lock:
            pending = list(self._pending_unmarks)
            shown = list(self._pending_shown.values())
        if pending:
            with self._call("unmark_feedback", FEEDBACK_DOWN):
                self.client.delete(*[self._mark_key(i) for i in pending])
            with self._lock:
                self._pending_unmarks.difference_update(pending)
        if shown:
            with self._call("remember", FEEDBACK_DOWN):
                pipe = self.client.pipeline(transaction=False)
                for shortlist in shown:
                    ttl_ms = self._ttl_ms(shortlist)
                    if ttl_ms > 0:  # NX: never overwrite one a feedback mark already refers to
                        pipe.set(self._shown_key(shortlist.shortlist_id), self._record(shortlist),
                                 px=ttl_ms, nx=True)
                pipe.execute()
            with self._lock:
                for shortlist in shown:
                    if self._pending_shown.get(shortlist.shortlist_id) is shortlist:
                        del self._pending_shown[shortlist.shortlist_id]
