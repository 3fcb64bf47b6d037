"""Redis as the shared source of truth for many replicas.

Everything lives under one key prefix (``shortlist:`` by default)::

    <p>registries               hash   registry -> current version (the "current" pointer)
    <p>versions                 hash   registry -> newest version ever assigned (kept on delete)
    <p>registry:<name>          hash   version -> RegistryRecord JSON (the newest two versions)
    <p>embeddings:<model-key>   hash   32-byte content hash -> float32 vector bytes
    <p>shown:<shortlist_id>     string ShownShortlist JSON, expires after the feedback retention
    <p>feedback-mark:<id>       string "feedback recorded" flag (SET NX), expires with the above
    <p>feedback                 stream accepted feedback events (XADD; replayed with XRANGE)
    <p>changes                  pub/sub channel: "<registry> <version>" after every write

Writes are Lua scripts, so each is atomic: a new version's record, the current pointer and the
version counter change together, and a reader (which loads pointer and record in one script)
never sees half a version. A save is accepted only for ``newest assigned + 1``: two replicas
racing on a registry cannot both get version N, and numbers are not reused after a delete.

Connection and timeout errors become :class:`~registry.errors.StoreUnavailable`. Keys span
several hash slots, so Redis Cluster is not supported; a single primary (managed or not, with
replicas for failover) is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any, cast

import numpy as np
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from registry.errors import ShortlistNotFound, StoreUnavailable, VersionConflict
from registry.feedback import (
    CHECKPOINT_FORMAT,
    FeedbackEvent,
    LogCompacted,
    ShownShortlist,
    ToolEfficiency,
    parse_checkpoint,
)
from registry.store.base import RegistryRecord

log = logging.getLogger(__name__)

KEEP_VERSIONS = 2
_CHUNK = 2000  # hash fields per HMGET/HSET round trip
# Redis replies that mean "the server cannot serve writes right now", not a bug of ours.
_UNAVAILABLE_REPLIES = ("LOADING", "READONLY", "MASTERDOWN", "MISCONF", "OOM", "NOREPLICAS")

_SAVE = """
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local version = tonumber(ARGV[2])
if version ~= last + 1 then
  return {0, last}
end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local old = version - tonumber(ARGV[5])
if old >= 1 then
  redis.call('HDEL', KEYS[3], tostring(old))
end
redis.call('PUBLISH', ARGV[4], ARGV[1] .. ' ' .. ARGV[2])
return {1, version}
"""

_LOAD = """
local version = redis.call('HGET', KEYS[1], ARGV[1])
if not version then
  return false
end
return {version, redis.call('HGET', KEYS[2], version)}
"""

_DELETE = """
local existed = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
if existed == 1 then
  redis.call('PUBLISH', ARGV[2], ARGV[1] .. ' deleted')
end
return existed
"""

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


def connect(url: str, *, timeout: float = 5.0) -> redis.Redis:
    """A client for ``url`` that fails fast when Redis is down.

    redis-py's default retries for about ten seconds; during an outage that would stall every
    write. One quick retry absorbs a dropped idle connection, nothing more.
    """
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=min(timeout, 2.0),
        socket_timeout=timeout,
        retry=Retry(ExponentialBackoff(cap=0.1, base=0.02), 1),
        health_check_interval=30,
    )


class StoreHealth:
    """Whether the last Redis call succeeded; shared by the store, the memory and the log.

    Request threads read :attr:`up` to skip best-effort Redis calls during an outage; the
    sync thread's successful poll sets it back.
    """

    def __init__(self) -> None:
        self.up = True
        self._last_warning = 0.0

    def failed(self, what: str, exc: BaseException) -> None:
        if self.up or time.monotonic() - self._last_warning > 30:
            log.warning("redis unavailable (%s): %s: %s", what, type(exc).__name__, exc)
            self._last_warning = time.monotonic()
        self.up = False

    def succeeded(self) -> None:
        if not self.up:
            log.info("redis is reachable again")
        self.up = True


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return True
    if isinstance(exc, redis.exceptions.ResponseError):
        return str(exc).split(" ", 1)[0].upper() in _UNAVAILABLE_REPLIES
    return isinstance(exc, OSError)


class _RedisBase:
    def __init__(self, client: redis.Redis, prefix: str, health: StoreHealth | None) -> None:
        self.client = client
        self.prefix = prefix
        self.health = health or StoreHealth()

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    @contextmanager
    def _call(self, what: str, message: str) -> Iterator[None]:
        try:
            yield
        except redis.exceptions.RedisError as exc:
            if not _is_unavailable(exc):
                raise
            self.health.failed(what, exc)
            raise StoreUnavailable(message, {"store": "redis", "operation": what}) from exc
        except OSError as exc:
            self.health.failed(what, exc)
            raise StoreUnavailable(message, {"store": "redis", "operation": what}) from exc
        self.health.succeeded()


STORE_DOWN = "the registry store (Redis) is unavailable; queries are still answered, retry writes later"
FEEDBACK_DOWN = "the feedback store (Redis) is unavailable; feedback is not recorded, retry later"
_COMPACT_LOCK_MS = 120_000
_RELEASE_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisStore(_RedisBase):
    """Registries, versions and the embedding cache in Redis (a ``SharedStore``).

    Args:
        client: a client from :func:`connect` (binary replies: no ``decode_responses``).
        prefix: key prefix; several deployments can share one Redis with different prefixes.
        health: shared outage flag (one is created when omitted).
    """

    def __init__(
        self, client: redis.Redis, prefix: str = "shortlist:", health: StoreHealth | None = None
    ) -> None:
        super().__init__(client, prefix, health)
        self.channel = self._key("changes")
        self._current = self._key("registries")
        self._assigned = self._key("versions")
        self._save = client.register_script(_SAVE)
        self._load = client.register_script(_LOAD)
        self._delete = client.register_script(_DELETE)
        self._pubsub: Any = None

    @classmethod
    def from_url(cls, url: str, prefix: str = "shortlist:") -> RedisStore:
        return cls(connect(url), prefix)

    def _registry_key(self, registry: str) -> str:
        return self._key("registry", registry)

    # -- registries ---------------------------------------------------------------------------

    def list_registries(self) -> list[str]:
        with self._call("list", STORE_DOWN):
            names = self.client.hkeys(self._current)
        return sorted(_text(n) for n in names)

    def version(self, registry: str) -> int | None:
        with self._call("version", STORE_DOWN):
            raw = self.client.hget(self._current, registry)
        return int(raw) if raw is not None else None

    def versions(self) -> dict[str, int]:
        with self._call("versions", STORE_DOWN):
            raw = self.client.hgetall(self._current)
        return {_text(k): int(v) for k, v in raw.items()}

    def load(self, registry: str) -> RegistryRecord | None:
        with self._call("load", STORE_DOWN):
            found = self._load(keys=[self._current, self._registry_key(registry)], args=[registry])
        if not found or found[1] is None:
            return None
        return RegistryRecord.from_json(json.loads(found[1]))

    def save(self, record: RegistryRecord) -> None:
        """Store ``record`` as the registry's current version.

        Raises:
            VersionConflict: ``record.version`` is not the newest assigned version + 1.
            StoreUnavailable: Redis cannot be reached.
        """
        payload = json.dumps(record.to_json(), ensure_ascii=False, separators=(",", ":"))
        with self._call("save", STORE_DOWN):
            accepted, latest = self._save(
                keys=[self._current, self._assigned, self._registry_key(record.registry)],
                args=[record.registry, record.version, payload, self.channel, KEEP_VERSIONS],
            )
        if not accepted:
            raise VersionConflict(record.registry, record.version, int(latest))

    def delete(self, registry: str) -> bool:
        with self._call("delete", STORE_DOWN):
            existed = self._delete(
                keys=[self._current, self._registry_key(registry)], args=[registry, self.channel]
            )
        return bool(existed)

    # -- embedding cache ----------------------------------------------------------------------

    def _embedding_key(self, model_id: str) -> str:
        return self._key("embeddings", hashlib.sha256(model_id.encode("utf-8")).hexdigest()[:24])

    def get_embeddings(self, model_id: str, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        key = self._embedding_key(model_id)
        found: dict[str, np.ndarray] = {}
        wanted = list(hashes)
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start : start + _CHUNK]
            with self._call("get_embeddings", STORE_DOWN):
                values = self.client.hmget(key, [bytes.fromhex(h) for h in chunk])
            for content_hash, raw in zip(chunk, values):
                if isinstance(raw, bytes):
                    found[content_hash] = np.frombuffer(raw, dtype=np.float32).copy()
        return found

    def put_embeddings(self, model_id: str, vectors: Mapping[str, np.ndarray]) -> None:
        key = self._embedding_key(model_id)
        items = [
            (bytes.fromhex(h), np.asarray(v, dtype=np.float32).tobytes())
            for h, v in vectors.items()
        ]
        for start in range(0, len(items), _CHUNK):
            with self._call("put_embeddings", STORE_DOWN):
                self.client.hset(key, mapping=dict(items[start : start + _CHUNK]))

    # -- change notifications -----------------------------------------------------------------

    def wait_for_change(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a change notification; drains every pending one.

        Only the sync thread calls this (a pub/sub connection is not thread-safe). After an
        error the subscription is rebuilt on the next call.
        """
        try:
            if self._pubsub is None:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                self._pubsub = pubsub
            message = self._pubsub.get_message(timeout=timeout)
            if message is None:
                return False
            while self._pubsub.get_message(timeout=0) is not None:
                pass  # one refresh covers every change announced so far
            return True
        except (redis.exceptions.RedisError, OSError) as exc:
            self._close_pubsub()
            if isinstance(exc, redis.exceptions.RedisError) and not _is_unavailable(exc):
                raise
            self.health.failed("subscribe", exc)
            raise StoreUnavailable(STORE_DOWN, {"store": "redis", "operation": "subscribe"}) from exc

    def _close_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            # closing a broken connection may raise; it is gone either way
            with suppress(Exception):
                pubsub.close()

    def close(self) -> None:
        self._close_pubsub()
        self.client.close()


class RedisShortlistMemory(_RedisBase):
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


def _stream_id(entry_id: bytes | str) -> tuple[int, int]:
    ms, _, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).partition("-")
    return int(ms), int(seq or 0)


class RedisFeedbackLog(_RedisBase):
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
