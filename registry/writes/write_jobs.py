"""Large uploads run as durable background jobs (HTTP: 202 and a job to poll).

The payload is persisted with the job before the 202 (:mod:`registry.job_queue`), so a crash never
loses an acknowledged upload: at the next start the job is prepared again from it and run.
A job caught *running* by the crash may already have committed: when the registry's version
moved since it started, it is reported ``done`` if the registry holds exactly what it wrote,
else ``failed`` (re-send it); it is never applied on top of a later write.

An acknowledged upload never undoes a write acknowledged after it: every write to a registry
(a synchronous PUT, upsert or tool delete, a DELETE, a later job's commit) first marks the
registry's unfinished jobs accepted before it (:meth:`WriteJobs.supersede`, durable in the job
records), and a job checks its mark before it embeds and again inside every commit attempt,
under the registry's lock and after syncing with the store. A marked job ends ``superseded``
and commits nothing. The mark is written before the later write saves, so either the job
committed first (and the later write lands on top) or it sees the mark.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from registry.errors import ShortlistError
from registry.index.snapshot import Snapshot
from registry.job_queue import JobQueue, JobRecords, Task, new_job_id
from registry.snapshots import RegistryInfo, Snapshots
from registry.tools import ToolLimits, parse_tools
from registry.writes.prepared import JobState, PreparedWrite

__all__ = ["WriteJob", "WriteJobs"]

log = logging.getLogger(__name__)


class JobError(ShortlistError):
    """A persisted job's error, as it was reported (its type kept)."""

    def __init__(self, error_type: str, message: str, details: Any = None) -> None:
        super().__init__(message, details)
        self.error_type = error_type


@dataclass
class WriteJob:
    """A write running in the background. ``info`` is the new version once ``done``;
    ``error`` the domain error once ``failed`` (or why it was ``superseded``)."""

    id: str
    registry: str
    new_texts: int
    state: JobState = "queued"
    created_at: float = 0.0
    finished_at: float | None = None
    info: RegistryInfo | None = None
    error: ShortlistError | None = None
    resumed: bool = field(default=False)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> WriteJob:
        result, error = record.get("result"), record.get("error")
        return cls(
            id=record["id"],
            registry=record["registry"],
            new_texts=int(record.get("new_texts", 0)),
            state=record["state"],
            created_at=float(record["created"]),
            finished_at=record.get("finished"),
            info=RegistryInfo(**result) if result else None,
            error=JobError(error["type"], error["message"], error.get("details"))
            if error
            else (JobError("failed", record["reason"]) if record.get("reason") else None),
            resumed=bool(record.get("resumed", False)),
        )


class Writer(Protocol):
    """What resuming a write needs of the writer (:class:`registry.writes.writer.RegistryWriter`)."""

    limits: ToolLimits
    snapshots: Snapshots

    def prepare_put(self, registry: str, payload: Any) -> PreparedWrite: ...

    def prepare_upsert(self, registry: str, payload: Any) -> PreparedWrite: ...


def _error(exc: ShortlistError) -> dict[str, Any]:
    return {"type": exc.error_type, "message": exc.message, "details": exc.details}


def _info(info: Any) -> dict[str, Any] | None:
    if info is None:
        return None
    return {"registry": info.registry, "version": info.version, "tools": info.tools, "written_at": info.written_at}


class Superseded(ShortlistError):
    """A later write to the registry was acknowledged before this job committed."""

    error_type = "superseded"


def _outcome(prepared: PreparedWrite) -> Task:
    def run() -> dict[str, Any]:
        try:
            if prepared.guard is not None:
                prepared.guard()  # before embedding: a superseded job costs nothing
            return {"state": "done", "result": _info(prepared.run())}
        except Superseded as exc:
            return {"state": "superseded", "error": _error(exc)}
        except ShortlistError as exc:
            return {"state": "failed", "error": _error(exc)}

    return run


def _superseded(kind: str, registry: str, reason: str) -> Task:
    error = {"type": Superseded.error_type, "message": reason, "details": {"registry": registry}}
    return lambda: {"state": "superseded", "error": error}


def holds(snap: Snapshot | None, kind: str, payload: Any, limits: ToolLimits) -> bool:
    """Whether ``snap`` holds exactly what the write of ``payload`` would leave."""
    if snap is None:
        return False
    try:
        tools = parse_tools(payload, limits)
    except ShortlistError:
        return False
    if kind == "put":
        return [t.definition for t in snap.tools] == [t.definition for t in tools]
    by_name = {t.name: t.definition for t in snap.tools}
    return all(by_name.get(t.name) == t.definition for t in tools)


class WriteJobs:
    """Prepared writes run one at a time on a background thread (one large embedding at a
    time bounds memory), at most ``limit`` unfinished per process, persisted in ``records``."""

    def __init__(self, records: JobRecords, *, limit: int = 8, lease_seconds: float = 30.0) -> None:
        self.queue = JobQueue("write", records, limit=limit, what="uploads", lease_seconds=lease_seconds)
        self._version: Callable[[str], int | None] = lambda registry: None
        self.queue.on_start = lambda record: {"before": self._version(record["registry"])}

    def submit(self, prepared: PreparedWrite, kind: str, payload: Any) -> WriteJob:
        """Persist the write (``kind`` "put" or "upsert", its parsed ``payload``) and queue it.

        Raises:
            QueueFull: ``limit`` uploads are unfinished here (nothing accepted).
            StorageUnavailable, StoreUnavailable: the job could not be made durable.
        """
        raw = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        record = {
            "id": new_job_id(),
            "registry": prepared.registry,
            "kind": kind,
            "new_texts": prepared.new_texts,
            "created": time.time(),
        }
        self._guard(prepared, record)
        return WriteJob.from_record(self.queue.submit(record, _outcome(prepared), raw))

    def supersede(self, registry: str, before: float, reason: str, *, keep: str | None = None) -> int:
        """Mark the registry's unfinished jobs accepted before ``before`` (Unix time) as
        superseded, bar ``keep``: called by every write to ``registry`` before it commits.
        Returns how many were marked.

        Raises:
            StorageUnavailable, StoreUnavailable: a mark could not be made durable (the write
                that called must not go ahead: the job could still undo it).
        """
        marked = 0
        for record in self.queue.open_records():
            if (
                record.get("registry") == registry
                and record["id"] != keep
                and float(record.get("created", 0.0)) < before
            ):
                self.queue.records.supersede(self.queue.kind, record["id"], reason)
                marked += 1
        if marked:
            log.info("registry %r: %d queued upload(s) superseded: %s", registry, marked, reason)
        return marked

    def _guard(self, prepared: PreparedWrite, record: dict[str, Any]) -> None:
        """Hook ``prepared`` to check its job's mark (and mark the jobs it overtakes)."""
        job_id, registry, created = record["id"], record["registry"], float(record["created"])

        def guard() -> None:
            reason = self.queue.records.superseded(self.queue.kind, job_id)
            if reason is not None:
                raise Superseded(reason, {"registry": registry, "job": job_id})
            # a job accepted earlier (on another replica) must not commit over this one
            self.supersede(registry, created, later_write(registry), keep=job_id)

        prepared.guard = guard

    def get(self, registry: str, job_id: str) -> WriteJob | None:
        record = self.queue.get(job_id)
        if record is None or record.get("registry") != registry:
            return None
        return WriteJob.from_record(record)

    def wait(self, job: WriteJob, timeout: float) -> bool:
        """Block until ``job`` finished (True, ``job`` updated) or ``timeout`` passed (tests, CLI)."""
        record = self.queue.wait(job.id, timeout)
        if record is None:
            return False
        done = WriteJob.from_record(record)
        job.state, job.info, job.error, job.finished_at = done.state, done.info, done.error, done.finished_at
        return True

    def resume(self, writer: Writer, wrap: Callable[[PreparedWrite], PreparedWrite]) -> int:
        """Queue again the jobs a stopped process left unfinished (``wrap`` hooks each
        prepared write as :meth:`submit`'s caller does). Returns how many."""

        def version(registry: str) -> int | None:
            snap = writer.snapshots.current(registry)
            return None if snap is None else snap.version

        self._version = version

        def make_task(record: dict[str, Any], raw: bytes | None) -> Task:
            registry, kind = record["registry"], record.get("kind", "put")
            if raw is None:
                return lambda: {"state": "failed", "reason": "its payload was lost"}
            payload = json.loads(raw)
            reason = self.queue.records.superseded(self.queue.kind, record["id"])
            if reason is not None:
                return _superseded(kind, registry, reason)
            if record["state"] == "running" and record.get("before") != version(registry):
                snap = writer.snapshots.current(registry)
                if holds(snap, kind, payload, writer.limits):
                    return lambda: {"state": "done", "result": _info(_snap_info(snap))}
                message = (
                    "the service stopped while this upload was being committed and registry "
                    f"{registry!r} has changed since (version {record.get('before')} -> "
                    f"{version(registry)}); it was not applied again: send it again"
                )
                error = {"type": "interrupted", "message": message, "details": {"registry": registry}}
                return lambda: {"state": "failed", "error": error}
            prepare = writer.prepare_put if kind == "put" else writer.prepare_upsert
            try:
                prepared = wrap(prepare(registry, payload))
            except ShortlistError as exc:
                failure = _error(exc)
                return lambda: {"state": "failed", "error": failure}
            self._guard(prepared, record)
            return _outcome(prepared)

        return self.queue.resume(make_task)

    def close(self) -> None:
        self.queue.close()


def later_write(registry: str) -> str:
    """Why a job is superseded by a later write (the message its status shows)."""
    return (
        f"a later write to registry {registry!r} was acknowledged before this upload was "
        "committed; it was not applied (the later write wins): send it again if it should be"
    )


def deleted(registry: str) -> str:
    """Why a job is superseded by a DELETE of its registry."""
    return f"registry {registry!r} was deleted after this upload was accepted; it was not applied"


def _snap_info(snap: Snapshot | None) -> Any:
    assert snap is not None
    return RegistryInfo(snap.registry, snap.version, snap.n_tools, snap.written_at)
