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
    <p>epoch                    string this data's random token (a wipe removes it: see below)
    <p>epoch:restoring          string marker while one replica re-publishes after a wipe

Writes are Lua scripts, so each is atomic: a new version's record, the current pointer and the
version counter change together, and a reader (which loads pointer and record in one script)
never sees half a version. A save is accepted only for ``newest assigned + 1``: two replicas
racing on a registry cannot both get version N, and numbers are not reused after a delete.

A Redis that lost its data (flushed, restarted without persistence) is noticed by the epoch
guard every registry script starts with, and refilled from what the replicas hold instead of
being mirrored (:mod:`registry.store.redis_epoch`). Served shortlists and the feedback stream
live in :mod:`registry.store.redis_shown` and :mod:`registry.store.redis_feedback`
(re-exported here).

Connection and timeout errors become :class:`~registry.errors.StoreUnavailable`.

On a Redis Cluster (``SHORTLIST_REDIS_CLUSTER``) the prefix is a hash tag (``{shortlist:}``)
and each registry has its own (``{shortlist:reg:<name>}``): its ``epoch`` (a copy of the
deployment's token), ``current`` and ``versions`` (one-field hashes) and ``registry:<name>``
live in its slot, so its scripts touch one slot, as the cluster requires, and registries spread
over the masters. ``<p>names`` (a set) lists every registry ever created; it is written before a
new registry's first version and never shrinks, so a listed registry whose slot has no copy
is one whose master lost its data, and is written back (:meth:`RedisStore._heal`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from registry.errors import StoreUnavailable, VersionConflict
from registry.store import codec
from registry.store.base import RegistryRecord
from registry.store.redis_base import (
    FEEDBACK_DOWN,
    STORE_DOWN,
    RedisBase,
    StoreHealth,
    as_text,
    connect,
    is_cluster,
    is_unavailable,
)
from registry.store.redis_epoch import (
    ADOPT,
    GUARD,
    RESTORE,
    RESTORE_ASSIGNED,
    RETIRE,
    WRITE_GUARD,
    StoreEpoch,
    StoreSettling,
    StoreWiped,
    guarded_reply,
)
from registry.store.redis_feedback import RedisFeedbackLog
from registry.store.redis_shown import RedisShortlistMemory

__all__ = [
    "FEEDBACK_DOWN",
    "STORE_DOWN",
    "RedisFeedbackLog",
    "RedisShortlistMemory",
    "RedisStore",
    "StoreHealth",
    "connect",
]

log = logging.getLogger(__name__)

KEEP_VERSIONS = 2
_SETTLE_SLACK_SECONDS = 5.0  # a write waits at most the settling window plus this
_CHUNK = 2000  # hash fields per HMGET/HSET round trip

# Registry scripts start with the epoch guard (redis_epoch.GUARD): KEYS[1] is the epoch key and
# ARGV[1] the token this process knows; on another epoch they change nothing and answer -1.
_SAVE = WRITE_GUARD + """
local last = tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '0')
local version = tonumber(ARGV[3])
if version ~= last + 1 then
  return {0, last}
end
redis.call('HSET', KEYS[4], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
local old = version - tonumber(ARGV[6])
if old >= 1 then
  redis.call('HDEL', KEYS[4], tostring(old))
end
redis.call('PUBLISH', ARGV[5], ARGV[2] .. ' ' .. ARGV[3])
return {1, version}
"""

_LOAD = GUARD + """
local version = redis.call('HGET', KEYS[2], ARGV[2])
if not version then
  return false
end
return {version, redis.call('HGET', KEYS[3], version)}
"""

_DELETE = WRITE_GUARD + """
local existed = redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[3])
if existed == 1 then
  redis.call('PUBLISH', ARGV[3], ARGV[2] .. ' deleted')
end
return existed
"""

_VERSION = GUARD + """
return redis.call('HGET', KEYS[2], ARGV[2])
"""

_VERSIONS = GUARD + """
return {redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', KEYS[3])}
"""

# Redis Cluster: the registry names (a set under the deployment's tag), behind the global guard.
_NAMES = GUARD + """
return redis.call('SMEMBERS', KEYS[2])
"""


@dataclass(frozen=True, slots=True)
class _RegistryKeys:
    """Where a registry's scripts look: the epoch to guard with, the current-version and
    version-counter hashes (field: the registry name) and the hash of its versions."""

    epoch: str
    current: str
    assigned: str
    record: str


class _ScriptBatch:
    """Script calls sent in one round trip (a pipeline) on one Redis; one by one on a cluster,
    whose pipelines cannot load a script a node lacks (a promoted replica has none cached)."""

    def __init__(self, client: Any) -> None:
        self._pipe = None if is_cluster(client) else client.pipeline(transaction=False)
        self._replies: list[Any] = []

    def run(self, script: Any, keys: list[Any], args: list[Any]) -> None:
        if self._pipe is None:
            self._replies.append(script(keys=keys, args=args))
        else:
            script(keys=keys, args=args, client=self._pipe)

    def execute(self) -> list[Any]:
        return self._replies if self._pipe is None else list(self._pipe.execute())


class RedisStore(RedisBase):
    """Registries, versions and the embedding cache in Redis (a ``SharedStore``).

    A Redis that loses its data (flushed, or restarted without persistence) is detected by the
    epoch guard of every registry script and repopulated from what the replicas hold
    (:mod:`registry.store.redis_epoch`); :meth:`set_republish_source` says what that is.

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
        self.epoch = StoreEpoch(client, prefix)
        # Redis Cluster: each registry's keys under its own hash tag (see _keys_of)
        self.cluster = is_cluster(client)
        self._names = self._key("names")  # cluster: every registry ever created (a set)
        self._tag_base = prefix.replace("{", "").replace("}", "")
        self._save = client.register_script(_SAVE)
        self._load = client.register_script(_LOAD)
        self._delete = client.register_script(_DELETE)
        self._version = client.register_script(_VERSION)
        self._versions = client.register_script(_VERSIONS)
        self._restore = client.register_script(RESTORE)
        self._restore_assigned = client.register_script(RESTORE_ASSIGNED)
        self._retire = client.register_script(RETIRE)
        self._names_now = client.register_script(_NAMES)
        self._adopt = client.register_script(ADOPT)
        self._pubsub: Any = None
        self._held: Callable[[], list[RegistryRecord]] = list
        self._held_versions: Callable[[], dict[str, int]] | None = None
        self._after_republish: Callable[[bool], None] | None = None
        # what the last versions() call saw: current versions and version counters
        self._current_seen: dict[str, int] = {}
        self._assigned_seen: dict[str, int] = {}

    @classmethod
    def from_url(cls, url: str, prefix: str = "shortlist:") -> RedisStore:
        return cls(connect(url), prefix)

    def _registry_key(self, registry: str) -> str:
        return self._keys_of(registry).record

    def _keys_of(self, registry: str) -> _RegistryKeys:
        """A registry's keys: on one Redis the shared hashes; on a cluster its own hash tag
        (``{shortlist:reg:<name>}epoch`` ...), so each registry's scripts touch one slot and
        registries spread over the masters."""
        if not self.cluster:
            return _RegistryKeys(self.epoch.key, self._current, self._assigned, self._key("registry", registry))
        tag = "{" + self._tag_base + "reg:" + registry + "}"
        return _RegistryKeys(tag + "epoch", tag + "current", tag + "versions", tag + "registry:" + registry)

    # -- a wiped store ------------------------------------------------------------------------

    def set_republish_source(
        self,
        held: Callable[[], list[RegistryRecord]],
        after: Callable[[bool], None] | None = None,
        held_versions: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        """What this replica re-publishes when the store lost its data: ``held()`` gives the
        registry versions it serves; ``after(won)`` runs next (e.g. the feedback counts).
        ``held_versions()`` (cheap: no records) lets every poll notice a store that went *back*
        (restarted from an older snapshot, its epoch intact) and write back what it lost."""
        self._held = held
        self._after_republish = after
        self._held_versions = held_versions

    def _guarded(
        self, what: str, run: Callable[[str], Any], registry: str | None = None,
        *, create: bool = False, absent: Any = None,
    ) -> Any:
        """``run(token)`` (a guarded script); on another epoch: recover, then run it again; in
        the settling window after a wipe (writes only): wait, then run it again.

        On a cluster a registry's scripts guard with its slot's epoch copy (``registry``): a
        slot without one is a new registry (created if ``create``, else ``absent`` is the
        answer) or one whose node lost its data (written back by :meth:`_heal`)."""
        wipes = 0
        settled_by = time.monotonic() + self.epoch.settle_ms / 1000 + _SETTLE_SLACK_SECONDS
        while wipes < 3:
            with self._call(what, STORE_DOWN):
                token: str | None = None
                try:
                    token = self.epoch.current()
                    return guarded_reply(run(token))
                except StoreWiped:
                    wipes += 1
                    if token is None:  # vanished at first use; just run again
                        continue
                    if registry is not None and self.cluster:
                        with suppress(StoreWiped):  # the deployment's epoch changed: recover below
                            if self._heal(registry, token, create):
                                return absent
                            continue
                    with suppress(StoreWiped):  # wiped again while recovering: once more
                        self.epoch.recover(token, self._republish)
                except StoreSettling:
                    if time.monotonic() > settled_by:
                        break
                    time.sleep(0.05)
        raise StoreUnavailable(
            "the registry store (Redis) lost its data and is being refilled by the replicas; retry",
            {"store": "redis", "operation": what},
        )

    def _heal(self, registry: str, token: str, create: bool) -> bool:
        """Cluster: a registry's slot has no epoch copy, or another one. True: the registry was
        never created (and ``create`` is false); else the slot is ready for the call again.

        Raises:
            StoreWiped: the deployment's own epoch is not ``token`` (a full recovery is due).
        """
        keys = self._keys_of(registry)
        found = self.client.get(self.epoch.key)
        if found is None or as_text(found) != token:
            raise StoreWiped("the store's epoch changed")
        mine = self.client.get(keys.epoch)
        if mine is not None and as_text(mine) == token:
            return False  # another replica healed it meanwhile
        if mine is None and not self.client.sismember(self._names, registry):
            if not create:
                return True
            # a new registry: its epoch copy first, then its name (a name without a copy means
            # a slot that lost its data, so the order keeps that meaning)
            self.client.set(keys.epoch, token, nx=True)
            self.client.sadd(self._names, registry)
            return False
        # its node lost the data (or kept an older epoch's): write back what this replica holds
        written = self._republish_one(registry, token, [r for r in self._held() if r.registry == registry])
        log.warning("registry %r: its Redis Cluster slot lost its data (or an older epoch's); "
                    "%d versions written back by this replica", registry, written)
        return False

    def _republish_one(self, registry: str, token: str, records: list[RegistryRecord]) -> int:
        """Cluster: adopt ``token`` in the registry's slot, then write back ``records`` (its
        versions this replica holds) where the slot has an older one or none, and its counter."""
        keys = self._keys_of(registry)
        self._adopt(keys=[keys.epoch], args=[token, max(1, self.epoch.settle_ms)])
        written = 0
        for record in records:
            payload = codec.dumps(record.to_json())
            written += guarded_reply(self._restore(
                keys=[keys.epoch, keys.current, keys.assigned, keys.record],
                args=[token, registry, record.version, payload, self.channel],
            )) == 1
        counter = max([self._assigned_seen.get(registry, 0), *(r.version for r in records)])
        if counter:
            guarded_reply(self._restore_assigned(keys=[keys.epoch, keys.assigned], args=[token, registry, counter]))
        return written

    def _republish(self, token: str, won: bool, after: bool = True) -> int:
        """Write what this replica holds where the store has an older version or none; then
        ``after`` (unless told not to) the feedback counts and learning state."""
        records = self._held()
        assigned = dict(self._assigned_seen)
        for record in records:
            assigned[record.registry] = max(assigned.get(record.registry, 0), record.version)
        if self.cluster:
            return self._republish_cluster(token, won, records, assigned, after)
        batch = _ScriptBatch(self.client)
        for record in records:
            payload = codec.dumps(record.to_json())
            batch.run(
                self._restore,
                [self.epoch.key, self._current, self._assigned, self._registry_key(record.registry)],
                [token, record.registry, record.version, payload, self.channel],
            )
        if assigned:
            flat = [item for pair in assigned.items() for item in pair]
            batch.run(self._restore_assigned, [self.epoch.key, self._assigned], [token, *flat])
        held = {record.registry for record in records}
        deleted = [
            item
            for name, version in self._assigned_seen.items()
            if name not in self._current_seen and name not in held
            for item in (name, version)
        ]
        if deleted:
            batch.run(self._retire, [self.epoch.key, self._current], [token, self.channel, self._registry_key(""), *deleted])
        replies = [guarded_reply(reply) for reply in batch.execute()]
        if self._after_republish is not None:
            self._after_republish(won)
        return sum(1 for reply in replies[: len(records)] if reply == 1)

    def _republish_cluster(
        self, token: str, won: bool, records: list[RegistryRecord], assigned: dict[str, int], after: bool
    ) -> int:
        """:meth:`_republish` on a cluster: the names (idempotent, under the deployment's tag),
        then registry by registry, each in its own slot."""
        if assigned:
            self.client.sadd(self._names, *assigned)
        written = 0
        for name in sorted(assigned):
            written += self._republish_one(name, token, [r for r in records if r.registry == name])
        held = {record.registry for record in records}
        for name, version in self._assigned_seen.items():
            if name not in self._current_seen and name not in held:  # seen deleted: delete again
                keys = self._keys_of(name)
                guarded_reply(self._retire(
                    keys=[keys.epoch, keys.current],
                    args=[token, self.channel, keys.record.removesuffix(name), name, version],
                ))
        if after and self._after_republish is not None:
            self._after_republish(won)
        return written

    # -- registries ---------------------------------------------------------------------------

    def _versions_now(self, catch_up: bool = True) -> tuple[dict[str, int], dict[str, int]]:
        if self.cluster:
            current, assigned = self._versions_cluster()
        else:
            current, assigned = self._guarded(
                "versions",
                lambda token: self._versions(keys=[self.epoch.key, self._current, self._assigned], args=[token]),
            )

        def pairs(flat: list[bytes]) -> dict[str, int]:
            return {as_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

        seen = pairs(current), pairs(assigned)
        if catch_up and self._behind(*seen):
            with self._call("versions", STORE_DOWN):
                # on a cluster a registry's master went back, not the deployment's (the
                # feedback stream's): the feedback counts stay as they are
                self.epoch.catch_up(lambda token, won: self._republish(token, won, after=not self.cluster))
            return self._versions_now(catch_up=False)
        self._current_seen, self._assigned_seen = seen
        return seen

    def _versions_cluster(self) -> tuple[list[bytes], list[bytes]]:
        """Cluster: the names (deployment slot), then each registry's versions (its slot)."""
        names = self._guarded(
            "versions", lambda token: self._names_now(keys=[self.epoch.key, self._names], args=[token])
        )
        current: list[bytes] = []
        assigned: list[bytes] = []
        for name in sorted(as_text(n) for n in names):
            keys = self._keys_of(name)
            found = self._guarded("versions", self._versions_of(keys), name, absent=([], []))
            current += found[0]
            assigned += found[1]
        return current, assigned

    def _versions_of(self, keys: _RegistryKeys) -> Callable[[str], Any]:
        return lambda token: self._versions(keys=[keys.epoch, keys.current, keys.assigned], args=[token])

    def _behind(self, current: dict[str, int], assigned: dict[str, int]) -> list[str]:
        """Registries this replica holds at a version the store has lost: older there, or
        absent without a delete (a delete keeps the counter at or above the deleted version).
        Versions only grow, so either means the store went back (an older snapshot)."""
        if self._held_versions is None:
            return []
        return [
            name
            for name, version in self._held_versions().items()
            if current.get(name, 0) < version and (name in current or assigned.get(name, 0) < version)
        ]

    def list_registries(self) -> list[str]:
        return sorted(self._versions_now()[0])

    def version(self, registry: str) -> int | None:
        keys = self._keys_of(registry)
        raw = self._guarded(
            "version",
            lambda token: self._version(keys=[keys.epoch, keys.current], args=[token, registry]),
            registry,
        )
        found = int(raw) if raw is not None else None
        held = self._held_versions() if self._held_versions is not None else {}
        if held.get(registry, 0) > (found or 0):  # older than ours, or gone: check it all
            return self._versions_now()[0].get(registry)
        return found

    def versions(self) -> dict[str, int]:
        return self._versions_now()[0]

    def load(self, registry: str) -> RegistryRecord | None:
        record = self._load_now(registry)
        held = self._held_versions() if self._held_versions is not None else {}
        if held.get(registry, 0) > (record.version if record else 0):
            self._versions_now()  # older than ours, or gone: writes back what the store lost
            record = self._load_now(registry)
        return record

    def _load_now(self, registry: str) -> RegistryRecord | None:
        keys = self._keys_of(registry)
        found = self._guarded(
            "load",
            lambda token: self._load(keys=[keys.epoch, keys.current, keys.record], args=[token, registry]),
            registry,
        )
        if not found or found[1] is None:
            return None
        return RegistryRecord.from_json(codec.loads(found[1]))

    def save(self, record: RegistryRecord) -> None:
        """Store ``record`` as the registry's current version.

        Raises:
            VersionConflict: ``record.version`` is not the newest assigned version + 1.
            StoreUnavailable: Redis cannot be reached.
        """
        payload = codec.dumps(record.to_json())
        of = self._keys_of(record.registry)
        keys = [of.epoch, of.current, of.assigned, of.record]
        accepted, latest = self._guarded(
            "save",
            lambda token: self._save(
                keys=keys, args=[token, record.registry, record.version, payload, self.channel, KEEP_VERSIONS]
            ),
            record.registry, create=True,
        )
        if not accepted:
            raise VersionConflict(record.registry, record.version, int(latest))

    def delete(self, registry: str) -> bool:
        keys = self._keys_of(registry)
        existed = self._guarded(
            "delete",
            lambda token: self._delete(keys=[keys.epoch, keys.current, keys.record], args=[token, registry, self.channel]),
            registry, absent=0,
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
            if isinstance(exc, redis.exceptions.RedisError) and not is_unavailable(exc):
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
