"""Durable job records and payloads in the shared Redis (see :mod:`registry.store.job_records`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from registry.store.job_records import FINISHED_TTL_SECONDS, OPEN_STATES
from registry.store.redis_base import unreachable_is_unavailable

__all__ = ["RedisJobRecords"]

_RENEW = """
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
end
return 1
"""


class RedisJobRecords:
    """``<p>job:<kind>:<id>`` (record), ``...:payload``, ``...:owner`` (the lease of the process
    running it), ``...:superseded`` (a later write's mark) and ``<p>jobs:<kind>:open`` (a sorted
    set of unfinished ids by creation time)."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._renew = client.register_script(_RENEW)

    def _key(self, kind: str, job_id: str, part: str = "") -> str:
        return f"{self.prefix}job:{kind}:{job_id}" + (f":{part}" if part else "")

    def _open(self, kind: str) -> str:
        return f"{self.prefix}jobs:{kind}:open"

    def _call(self, what: str, action: Callable[[], Any]) -> Any:
        with unreachable_is_unavailable("job store", what, "; retry later"):
            return action()

    def save(self, kind: str, record: dict[str, Any], payload: bytes | None = None) -> None:
        job_id = record["id"]
        pipe = self.client.pipeline(transaction=True)
        if record["state"] in OPEN_STATES:
            if payload is not None:
                pipe.set(self._key(kind, job_id, "payload"), payload)
            pipe.set(self._key(kind, job_id), json.dumps(record))
            pipe.zadd(self._open(kind), {job_id: float(record.get("created", time.time()))})
        else:
            pipe.set(self._key(kind, job_id), json.dumps(record), ex=FINISHED_TTL_SECONDS)
            pipe.delete(
                self._key(kind, job_id, "payload"),
                self._key(kind, job_id, "owner"),
                self._key(kind, job_id, "superseded"),
            )
            pipe.zrem(self._open(kind), job_id)
        self._call("record a background job", pipe.execute)

    def load(self, kind: str, job_id: str) -> dict[str, Any] | None:
        raw = self._call("read a background job", lambda: self.client.get(self._key(kind, job_id)))
        return None if raw is None else dict(json.loads(raw))

    def payload(self, kind: str, job_id: str) -> bytes | None:
        raw = self._call("read a job's payload", lambda: self.client.get(self._key(kind, job_id, "payload")))
        return None if raw is None else bytes(raw)

    def unfinished(self, kind: str) -> list[dict[str, Any]]:
        ids = self._call("list background jobs", lambda: self.client.zrange(self._open(kind), 0, -1))
        out = []
        for raw_id in ids:
            job_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            record = self.load(kind, job_id)
            if record is not None and record.get("state") in OPEN_STATES:
                out.append(record)
        return out

    def claim(self, kind: str, job_id: str, owner: str, lease_seconds: float) -> bool:
        key = self._key(kind, job_id, "owner")
        held = self._call("claim a background job", lambda: self.client.get(key))
        if held is not None and (held.decode() if isinstance(held, bytes) else held) == owner:
            return True
        ms = max(1, int(lease_seconds * 1000))
        return bool(self._call("claim a background job", lambda: self.client.set(key, owner, nx=True, px=ms)))

    def renew(self, kind: str, job_ids: list[str], owner: str, lease_seconds: float) -> None:
        if job_ids:
            keys = [self._key(kind, job_id, "owner") for job_id in job_ids]
            ms = max(1, int(lease_seconds * 1000))
            self._call("renew job leases", lambda: self._renew(keys=keys, args=[owner, ms]))

    def supersede(self, kind: str, job_id: str, reason: str) -> None:
        key = self._key(kind, job_id, "superseded")
        self._call("record a background job", lambda: self.client.set(key, reason, nx=True, ex=FINISHED_TTL_SECONDS))

    def superseded(self, kind: str, job_id: str) -> str | None:
        key = self._key(kind, job_id, "superseded")
        raw = self._call("read a background job", lambda: self.client.get(key))
        return None if raw is None else (raw.decode() if isinstance(raw, bytes) else str(raw))
