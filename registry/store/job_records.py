"""Where durable job records and payloads live: the data directory, or the shared Redis.

A record is a JSON object with ``id``, ``state`` (``queued``, ``running``, then a final state)
and ``created``; a payload is bytes (an upload's body). :mod:`registry.jobs` runs the jobs.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from registry.errors import StoreUnavailable
from registry.fsio import atomic_write_bytes, storage_errors

__all__ = ["FINISHED_TTL_SECONDS", "OPEN_STATES", "JobRecords", "LocalJobRecords", "RedisJobRecords"]

OPEN_STATES = ("queued", "running")
FINISHED_TTL_SECONDS = 86_400  # a finished job's record is kept a day (and the last `keep`)
_JOB_ID = re.compile(r"[0-9a-f]{8,64}")


class JobRecords(Protocol):
    """Where job records (JSON objects with ``id``, ``state``, ``created``) and payloads live."""

    def save(self, kind: str, record: dict[str, Any], payload: bytes | None = None) -> None:
        """Store ``record`` (and ``payload`` with it); durable when this returns. A record in
        a finished state drops its payload."""
        ...

    def load(self, kind: str, job_id: str) -> dict[str, Any] | None: ...

    def payload(self, kind: str, job_id: str) -> bytes | None: ...

    def unfinished(self, kind: str) -> list[dict[str, Any]]:
        """Every record in an open state, oldest first."""
        ...

    def claim(self, kind: str, job_id: str, owner: str, lease_seconds: float) -> bool:
        """Take an unfinished job for ``owner`` (False: a live process holds it)."""
        ...

    def renew(self, kind: str, job_ids: list[str], owner: str, lease_seconds: float) -> None: ...

    def supersede(self, kind: str, job_id: str, reason: str) -> None:
        """Mark an unfinished job as overtaken by a later write (durable when this returns):
        it must not commit. A mark of its own, not its record, which its runner rewrites; the
        first mark's reason stays."""
        ...

    def superseded(self, kind: str, job_id: str) -> str | None:
        """The reason :meth:`supersede` gave for this job, or None."""
        ...


class LocalJobRecords:
    """``<data_dir>/jobs/<kind>/<id>.json`` and ``<id>.payload`` (one process per data dir, so
    every unfinished job found at start is this process's to resume)."""

    def __init__(self, data_dir: Path | str, keep: int = 1000) -> None:
        self.root = Path(data_dir) / "jobs"
        self.keep = keep
        self._lock = threading.Lock()

    def _dir(self, kind: str) -> Path:
        return self.root / kind

    def save(self, kind: str, record: dict[str, Any], payload: bytes | None = None) -> None:
        folder = self._dir(kind)
        job_id = record["id"]
        with storage_errors("recording a background job"):
            folder.mkdir(parents=True, exist_ok=True)
            if payload is not None:  # first the payload: a record never points at a missing one
                atomic_write_bytes(folder / f"{job_id}.payload", payload)
            atomic_write_bytes(folder / f"{job_id}.json", json.dumps(record).encode("utf-8"))
            if record["state"] not in OPEN_STATES:
                (folder / f"{job_id}.payload").unlink(missing_ok=True)
                (folder / f"{job_id}.superseded").unlink(missing_ok=True)
                self._prune(folder)

    def _prune(self, folder: Path) -> None:
        """Drop finished records past the last ``keep`` or older than a day."""
        with self._lock:
            files = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
            cutoff = time.time() - FINISHED_TTL_SECONDS
            excess = len(files) - self.keep
            for path in files:
                old = path.stat().st_mtime < cutoff
                if excess <= 0 and not old:
                    break
                record = self._read(path)
                if record is None or record.get("state") not in OPEN_STATES:
                    path.unlink(missing_ok=True)
                    excess -= 1

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def load(self, kind: str, job_id: str) -> dict[str, Any] | None:
        if not _JOB_ID.fullmatch(job_id):  # ids name files: never a path from a client
            return None
        return self._read(self._dir(kind) / f"{job_id}.json")

    def payload(self, kind: str, job_id: str) -> bytes | None:
        try:
            return (self._dir(kind) / f"{job_id}.payload").read_bytes()
        except FileNotFoundError:
            return None

    def unfinished(self, kind: str) -> list[dict[str, Any]]:
        records = [self._read(p) for p in self._dir(kind).glob("*.json")]
        open_ = [r for r in records if r is not None and r.get("state") in OPEN_STATES]
        return sorted(open_, key=lambda r: float(r.get("created", 0.0)))

    def claim(self, kind: str, job_id: str, owner: str, lease_seconds: float) -> bool:
        return True

    def renew(self, kind: str, job_ids: list[str], owner: str, lease_seconds: float) -> None:
        return None

    def supersede(self, kind: str, job_id: str, reason: str) -> None:
        path = self._dir(kind) / f"{job_id}.superseded"
        if path.exists():
            return
        with storage_errors("recording a background job"):
            atomic_write_bytes(path, reason.encode("utf-8"))

    def superseded(self, kind: str, job_id: str) -> str | None:
        if not _JOB_ID.fullmatch(job_id):
            return None
        try:
            return (self._dir(kind) / f"{job_id}.superseded").read_text("utf-8")
        except (FileNotFoundError, UnicodeDecodeError):
            return None


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
        import redis

        try:
            return action()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            raise StoreUnavailable(
                f"the job store (Redis) is unavailable: cannot {what}; retry later",
                {"store": "redis", "operation": what},
            ) from exc

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
