"""A Redis that lost its data (FLUSHALL, a restart without persistence) must not delete registries.

The store's *epoch* is a random token under ``<p>epoch``, written at first use (``SET NX``).
Every registry script of :class:`~registry.store.redis.RedisStore` starts with a guard: when
``<p>epoch`` is not the token this process knows, the script changes nothing and answers
``-1`` (:data:`WIPED`). So a wiped store is noticed by the first read or write that reaches it
(the sync thread's poll at the latest, every ``SHORTLIST_SYNC_INTERVAL_SECONDS``), and no read
sees "no registries" and no write lands on the empty store before the recovery below::

    claim      in one script, only if <p>epoch is absent (exactly one replica wins): SET it to
               a new token, SET <p>epoch:restoring (while the winner writes back) and
               <p>epoch:settling (a few sync intervals: the time every replica needs to notice)
    winner     writes back every registry it holds (same versions, same equivalents), the
               version counters it last saw, the embeddings and its feedback counts as the
               stream checkpoint, then deletes <p>epoch:restoring
    others     wait while <p>epoch:restoring exists, then write back only what they hold at a
               *newer* version than the store (a write of theirs the winner had not synced yet),
               delete again what they saw deleted, and adopt the token
    writes     saves and deletes wait while <p>epoch:settling exists (-2, :data:`SETTLING`), so
               no new version is numbered before every replica has written back what it holds

Every write-back goes through a "newer than the store" check, so versions never go backwards,
and a write that met the guard retries after the recovery, on top of what was written back (an
upsert racing the wipe gets version 8 on top of a held 7, never version 1 with only its tools).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

log = logging.getLogger(__name__)

WIPED = -1  # what a guarded script answers when the store's epoch is not ours
SETTLING = -2  # what a guarded write answers while replicas may still be writing back
RESTORE_MARKER_MS = 30_000  # a winner that dies mid-recovery blocks the others this long at most
SETTLE_MS = 5_000  # default settling window (StoreSync sets it from its poll interval)
SETTLING_SUFFIX = ":settling"  # <p>epoch:settling, named from the epoch key inside the scripts

# Prepended to every guarded script: KEYS[1] is the epoch key, ARGV[1] the token we know.
GUARD = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end\n"
# Prepended to writes (saves, deletes): also wait for the settling window after a wipe.
WRITE_GUARD = GUARD + f"if redis.call('EXISTS', KEYS[1] .. '{SETTLING_SUFFIX}') == 1 then return -2 end\n"

_CLAIM = """
local current = redis.call('GET', KEYS[1])
if current then
  return {0, current}
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[1], 'PX', tonumber(ARGV[2]))
redis.call('SET', KEYS[3], ARGV[1], 'PX', tonumber(ARGV[3]))
return {1, ARGV[1]}
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Re-publish one registry version unless the store already has that version or a newer one.
# KEYS: epoch, current pointers, assigned counters, the registry's hash.
# ARGV: token, registry, version, record JSON, change channel.
RESTORE = GUARD + """
local version = tonumber(ARGV[3])
local current = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if current >= version then
  return 0
end
redis.call('HSET', KEYS[4], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
local assigned = tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '0')
if assigned < version then
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
end
redis.call('PUBLISH', ARGV[5], ARGV[2] .. ' ' .. ARGV[3])
return 1
"""

# Raise version counters (those of deleted registries too) to at least what was last seen.
# KEYS: epoch, assigned counters. ARGV: token, then registry, version pairs.
RESTORE_ASSIGNED = GUARD + """
for i = 2, #ARGV, 2 do
  local last = tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '0')
  if last < tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
return 1
"""


# Delete again what this replica saw deleted before the wipe and another replica, not yet in
# step, re-published: a stored version at or below the counter seen with the registry absent is
# older than that delete (a re-creation after it would have a higher version).
# KEYS: epoch, current pointers. ARGV: token, change channel, registry key prefix, then registry,
# version pairs (registry hashes are named from the prefix; on a cluster: one registry per call).
RETIRE = GUARD + """
local retired = 0
for i = 4, #ARGV, 2 do
  local current = redis.call('HGET', KEYS[2], ARGV[i])
  if current and tonumber(current) <= tonumber(ARGV[i + 1]) then
    redis.call('HDEL', KEYS[2], ARGV[i])
    redis.call('DEL', ARGV[3] .. ARGV[i])
    redis.call('PUBLISH', ARGV[2], ARGV[i] .. ' deleted')
    retired = retired + 1
  end
end
return retired
"""


# Redis Cluster: give a registry's slot the store's token (its own epoch copy, which its scripts'
# guard checks). A slot that had none lost its data (or is new to a recovery): it also gets the
# settling window, so no version is numbered there before every replica has written back.
# KEYS: the registry's epoch key. ARGV: token, settling window (ms).
ADOPT = f"""
local found = redis.call('GET', KEYS[1])
if found == ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
if not found then
  redis.call('SET', KEYS[1] .. '{SETTLING_SUFFIX}', ARGV[1], 'PX', tonumber(ARGV[2]))
  return 2
end
return 1
"""


class StoreWiped(Exception):
    """A guarded script met another epoch (internal: the store recovers and retries)."""


class StoreSettling(Exception):
    """A guarded write met the settling window after a wipe (internal: the store waits)."""


Republish = Callable[[str, bool], int]  # (new token, won the claim) -> registries written


@dataclass(frozen=True, slots=True)
class Recovery:
    """One recovery of this process: who re-published and how long it took."""

    won: bool
    registries: int  # registry versions this process wrote (0 for a replica that only adopted)
    seconds: float  # from the claim to the adopted token (the winner's re-publish included)
    at: float  # wall clock


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class StoreEpoch:
    """This process's view of the store's epoch, and the recovery when it changes.

    Args:
        client: the store's Redis client.
        prefix: key prefix.
        marker_ms: TTL of the "re-publish in progress" marker.
        settle_ms: how long writes wait after a wipe this process claims (set it to a few sync
            intervals: every replica must notice and write back within it).
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        *,
        marker_ms: int = RESTORE_MARKER_MS,
        settle_ms: int = SETTLE_MS,
    ) -> None:
        self.client = client
        self.key = prefix + "epoch"
        self.marker_key = prefix + "epoch:restoring"
        self.settle_key = self.key + SETTLING_SUFFIX
        self.marker_ms = int(marker_ms)
        self.settle_ms = int(settle_ms)
        self.token: str | None = None
        self.recoveries: list[Recovery] = []
        self.catch_ups: list[Recovery] = []  # the store went back, its epoch intact
        self._lock = threading.Lock()
        self._claim = client.register_script(_CLAIM)
        self._release = client.register_script(_RELEASE)

    def current(self) -> str:
        """The token to guard scripts with; at first use, the store's (created if absent).

        A process that holds nothing yet simply adopts what it finds (after waiting for a
        re-publish in progress, so it does not start from half of it).

        Raises:
            redis.RedisError: Redis cannot be reached.
        """
        token = self.token
        if token is not None:
            return token
        with self._lock:
            if self.token is None:
                self._wait_for_marker()
                self.client.set(self.key, uuid.uuid4().hex, nx=True)
                found = self.client.get(self.key)
                if found is None:  # wiped between the two calls: the next call will claim
                    raise StoreWiped("the store's epoch vanished while it was being read")
                self.token = _text(found)
            return self.token

    def recover(self, seen: str, republish: Republish) -> None:
        """Bring the store back after a guard met another epoch than ``seen``.

        Runs once per wipe and process: threads that meet the guard meanwhile wait here, then
        find the new token adopted and retry.

        Raises:
            redis.RedisError: Redis cannot be reached (the old token is kept: the next call
                recovers again, and re-publishing is idempotent).
            StoreWiped: the store was wiped again while re-publishing.
        """
        with self._lock:
            if self.token != seen:
                return  # another thread of this process recovered already
            start = time.monotonic()
            won, token = self._claim(
                keys=[self.key, self.marker_key, self.settle_key],
                args=[uuid.uuid4().hex, self.marker_ms, max(1, self.settle_ms)],
            )
            won, token = bool(won), _text(token)
            if not won:
                self._wait_for_marker()
            try:
                written = republish(token, won)
            finally:
                if won:
                    self._release(keys=[self.marker_key], args=[token])
            self.token = token
            recovery = Recovery(won, written, time.monotonic() - start, time.time())
            self.recoveries.append(recovery)
            log.warning(
                "the Redis store lost its data (flushed or restarted empty): %s, %d registry "
                "versions re-published by this replica in %.3f s",
                "this replica won the re-publish" if won else "another replica re-published",
                written, recovery.seconds,
            )

    def catch_up(self, republish: Republish) -> None:
        """The store kept its epoch but lost versions this process holds (Redis restarted from
        an older snapshot): write back what it holds newer than the store, under the same lock
        as a recovery. Idempotent."""
        with self._lock:
            token = self.current()
            start = time.monotonic()
            written = republish(token, False)
            self.catch_ups.append(Recovery(False, written, time.monotonic() - start, time.time()))
            log.warning(
                "the Redis store went back to an older state (restarted from an older snapshot?): "
                "%d registry versions written back by this replica in %.3f s",
                written, time.monotonic() - start,
            )

    def _wait_for_marker(self) -> None:
        deadline = time.monotonic() + self.marker_ms / 1000
        while self.client.exists(self.marker_key) and time.monotonic() < deadline:
            time.sleep(0.02)


def guarded_reply(reply: Any) -> Any:
    """``reply`` unless it is a guard's answer (then :class:`StoreWiped` / :class:`StoreSettling`)."""
    if isinstance(reply, int) and reply == WIPED:
        raise StoreWiped("the store's epoch changed")
    if isinstance(reply, int) and reply == SETTLING:
        raise StoreSettling("replicas are writing back what they hold")
    return reply
