"""Durable background jobs: a record (and a payload) that outlives the process, a bounded queue,
one worker thread.

A job is *acknowledged* (HTTP 202) only after its record and payload are durable: files
fsynced and renamed into ``<data_dir>/jobs/<kind>/`` locally, or keys in Redis. So a crash
never loses an acknowledged job: at the next start its process (locally) or any replica
(Redis: once the dead owner's lease ran out) claims every unfinished one and runs it again,
or reports it ``failed`` with the reason; a poll never gets a 404 for a job it was given.

One job runs at a time per queue and process (a refit or an embedding at a time bounds memory
and CPU), and a queue holds at most ``limit`` unfinished jobs of this process: past it,
:class:`QueueFull` (HTTP 429 with ``Retry-After``) and nothing is accepted.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from registry.errors import ShortlistError, StoreUnavailable
from registry.fsio import atomic_write_bytes, storage_errors

__all__ = ["OPEN_STATES", "JobQueue", "JobRecords", "LocalJobRecords", "QueueFull", "RedisJobRecords"]

log = logging.getLogger(__name__)

OPEN_STATES = ("queued", "running")
FINISHED_TTL_SECONDS = 86_400  # a finished job's record is kept a day (and the last `keep`)
_JOB_ID = re.compile(r"[0-9a-f]{8,64}")


def new_job_id() -> str:
    return uuid.uuid4().hex


class QueueFull(ShortlistError):
    """A background queue holds its limit of unfinished jobs: nothing was accepted, retry later."""

    error_type = "too_many_requests"

    def __init__(self, what: str, limit: int, retry_after: int) -> None:
        super().__init__(
            f"too many {what} queued on this replica ({limit}, the limit); nothing was accepted, "
            f"retry in about {retry_after} s",
            {"queue": what, "limit": limit, "retry_after": retry_after},
        )
        self.retry_after = retry_after


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


_RENEW = """
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
end
return 1
"""


class RedisJobRecords:
    """``<p>job:<kind>:<id>`` (record), ``...:payload``, ``...:owner`` (the lease of the process
    running it) and ``<p>jobs:<kind>:open`` (a sorted set of unfinished ids by creation time)."""

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
            pipe.delete(self._key(kind, job_id, "payload"), self._key(kind, job_id, "owner"))
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


Task = Callable[[], dict[str, Any]]  # runs the job; returns the fields of its final record
Resume = Callable[[dict[str, Any], bytes | None], Task]  # a persisted job -> its task


class JobQueue:
    """The unfinished jobs of one kind in this process, run one at a time by a worker thread.

    Args:
        kind: ``"write"`` or ``"refit"`` (the records' folder or key part).
        records: where records live (:class:`LocalJobRecords` or :class:`RedisJobRecords`).
        limit: most unfinished jobs this process holds (queued or running).
        what: how a :class:`QueueFull` names the jobs ("uploads", "refits").
        lease_seconds: Redis: how long a dead owner's jobs stay claimed before another takes them.
    """

    def __init__(
        self,
        kind: str,
        records: JobRecords,
        *,
        limit: int,
        what: str,
        lease_seconds: float = 30.0,
        keep: int = 1000,
    ) -> None:
        self.kind = kind
        self.records = records
        self.limit = limit
        self.what = what
        self.lease_seconds = lease_seconds
        self.keep = keep
        self.owner = uuid.uuid4().hex
        self._queue: list[tuple[dict[str, Any], Task]] = []
        self._running: dict[str, Any] | None = None
        self._recent: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resume: Resume | None = None
        self._seconds_per_job = 5.0  # running estimate behind Retry-After
        self.on_start: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # extra fields

    # -- accepting ------------------------------------------------------------------------------

    def open_jobs(self) -> int:
        with self._lock:
            return len(self._queue) + (self._running is not None)

    def retry_after(self) -> int:
        """Seconds until about one slot frees up (at least 1)."""
        return max(1, round(self._seconds_per_job))

    def submit(self, record: dict[str, Any], task: Task, payload: bytes | None = None) -> dict[str, Any]:
        """Persist ``record`` (state ``queued``) with ``payload``, then queue ``task``.

        Raises:
            QueueFull: ``limit`` jobs are unfinished here; nothing was persisted.
            StorageUnavailable, StoreUnavailable: the record could not be made durable; nothing
                was accepted.
        """
        record = {**record, "state": "queued", "created": record.get("created") or time.time()}
        record.setdefault("id", new_job_id())
        with self._lock:
            if len(self._queue) + (self._running is not None) >= self.limit:
                raise QueueFull(self.what, self.limit, self.retry_after())
            self.records.save(self.kind, record, payload)
            if self.records.claim(self.kind, record["id"], self.owner, self.lease_seconds):
                self._enqueue(record, task)
        return record

    def _enqueue(self, record: dict[str, Any], task: Task) -> None:
        """Queue one job (the lock is held)."""
        self._remember(record)
        self._queue.append((record, task))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"{self.kind}-jobs", daemon=True)
            self._thread.start()
        self._wake.notify_all()

    def _remember(self, record: dict[str, Any]) -> None:
        self._recent[record["id"]] = record
        self._recent.move_to_end(record["id"])
        while len(self._recent) > self.keep:
            self._recent.popitem(last=False)

    # -- reading --------------------------------------------------------------------------------

    def get(self, job_id: str) -> dict[str, Any] | None:
        """The job's record: this process's copy, else the persisted one (another replica's,
        or one from before a restart)."""
        with self._lock:
            found = self._recent.get(job_id)
        if found is not None:
            return found
        return self.records.load(self.kind, job_id)

    def wait(self, job_id: str, timeout: float) -> dict[str, Any] | None:
        """Block until the job is finished (its record) or ``timeout`` passed (None)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                record = self._recent.get(job_id)
                if record is not None and record["state"] not in OPEN_STATES:
                    return record
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._wake.wait(min(left, 0.1))

    # -- resuming -------------------------------------------------------------------------------

    def resume(self, make_task: Resume) -> int:
        """Claim the unfinished jobs no live process holds and queue them again (in their
        order), up to the limit; a Redis queue keeps looking for more on its worker thread.
        Returns how many were claimed now."""
        self._resume = make_task
        claimed = self._claim_orphans()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"{self.kind}-jobs", daemon=True)
                self._thread.start()
        return claimed

    def _claim_orphans(self) -> int:
        make_task = self._resume
        if make_task is None:
            return 0
        claimed = 0
        for record in self.records.unfinished(self.kind):
            with self._lock:
                if record["id"] in self._recent or len(self._queue) + (self._running is not None) >= self.limit:
                    continue
            if not self.records.claim(self.kind, record["id"], self.owner, self.lease_seconds):
                continue
            try:
                task = make_task(record, self.records.payload(self.kind, record["id"]))
            except Exception as exc:  # a record it cannot run: say so on the job
                log.exception("%s job %s cannot be resumed", self.kind, record["id"])
                task = _failing(f"it could not be resumed after a restart: {type(exc).__name__}: {exc}")
            with self._lock:
                self._enqueue({**record, "state": "queued", "resumed": True}, task)
            claimed += 1
            log.warning("%s job %s resumed after a restart", self.kind, record["id"])
        return claimed

    # -- running --------------------------------------------------------------------------------

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._wake.notify_all()

    def _held_ids(self) -> list[str]:
        with self._lock:
            ids = [record["id"] for record, _ in self._queue]
            if self._running is not None:
                ids.append(self._running["id"])
        return ids

    def _heartbeat(self) -> None:
        """Renew this process's leases; pick up jobs of replicas that died (Redis)."""
        try:
            self.records.renew(self.kind, self._held_ids(), self.owner, self.lease_seconds)
            if not isinstance(self.records, LocalJobRecords):
                self._claim_orphans()
        except ShortlistError as exc:
            log.warning("%s jobs: %s", self.kind, exc.message)

    def _run(self) -> None:
        beat = max(0.05, self.lease_seconds / 3)
        next_beat = time.monotonic() + beat
        while not self._stop.is_set():
            with self._lock:
                while not self._queue and not self._stop.is_set() and time.monotonic() < next_beat:
                    self._wake.wait(max(0.01, next_beat - time.monotonic()))
                item = self._queue.pop(0) if self._queue else None
                if item is not None:
                    self._running = item[0]
            if time.monotonic() >= next_beat:
                self._heartbeat()
                next_beat = time.monotonic() + beat
            if item is not None and not self._stop.is_set():
                self._execute(*item)

    def _execute(self, record: dict[str, Any], task: Task) -> None:
        started = time.monotonic()
        extra = self.on_start(record) if self.on_start is not None else {}
        running = {**record, **extra, "state": "running", "started": time.time()}
        try:
            self.records.save(self.kind, running)
        except ShortlistError as exc:  # the job still runs; its record says queued meanwhile
            log.warning("%s job %s: %s", self.kind, record["id"], exc.message)
        with self._lock:
            self._remember(running)
        try:
            outcome = task()
        except Exception as exc:  # a bug must not kill the worker: report it on the job
            log.exception("%s job %s failed", self.kind, record["id"])
            outcome = {"state": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        finished = {**running, **outcome, "finished": time.time()}
        if finished["state"] in OPEN_STATES:
            finished["state"] = "failed"
        for attempt in range(3):
            try:
                self.records.save(self.kind, finished)
                break
            except ShortlistError as exc:
                log.warning("%s job %s: result not recorded yet: %s", self.kind, record["id"], exc.message)
                time.sleep(0.5 * (attempt + 1))
        self._seconds_per_job = 0.7 * self._seconds_per_job + 0.3 * (time.monotonic() - started)
        with self._lock:
            self._remember(finished)
            self._running = None
            self._wake.notify_all()


def _failing(reason: str) -> Task:
    return lambda: {"state": "failed", "reason": reason}
