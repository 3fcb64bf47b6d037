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

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from registry.errors import ShortlistError
from registry.store.job_records import (
    OPEN_STATES,
    JobRecords,
    LocalJobRecords,
)

__all__ = ["OPEN_STATES", "JobQueue", "JobRecords", "LocalJobRecords", "QueueFull"]

log = logging.getLogger(__name__)



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


Task = Callable[[], dict[str, Any]]  # runs the job; returns the fields of its final record
Resume = Callable[[dict[str, Any], bytes | None], Task]  # a persisted job -> its task


class JobQueue:
    """The unfinished jobs of one kind in this process, run one at a time by a worker thread.

    Args:
        kind: ``"write"`` or ``"refit"`` (the records' folder or key part).
        records: where records live (:class:`LocalJobRecords` or :class:`registry.store.redis_job_records.RedisJobRecords`).
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
        self._payloads: dict[str, bytes] = {}  # of this process's unfinished jobs
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
            if payload is not None:
                self._payloads[record["id"]] = payload  # for a store that loses its data
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

    def open_records(self) -> list[dict[str, Any]]:
        """Every unfinished job: this process's (queued or running) and, with a shared store,
        every other replica's."""
        with self._lock:
            found = {record["id"]: record for record, _ in self._queue}
            if self._running is not None:
                found[self._running["id"]] = self._running
        if not isinstance(self.records, LocalJobRecords):  # one process per data dir locally
            for record in self.records.unfinished(self.kind):
                found.setdefault(record["id"], record)
        return list(found.values())

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
            self._payloads.pop(record["id"], None)
            self._running = None
            self._wake.notify_all()

    def republish(self) -> int:
        """After the shared store lost its data: write back the records (and the payloads of
        unfinished jobs) this process holds, so polls keep answering; returns how many."""
        with self._lock:
            held = [(dict(r), self._payloads.get(r["id"])) for r in self._recent.values()]
        for record, payload in held:
            self.records.save(self.kind, record, payload if record["state"] in OPEN_STATES else None)
            if record["state"] in OPEN_STATES:
                self.records.claim(self.kind, record["id"], self.owner, self.lease_seconds)
        return len(held)


def _failing(reason: str) -> Task:
    return lambda: {"state": "failed", "reason": reason}
