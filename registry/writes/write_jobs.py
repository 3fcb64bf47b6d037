"""Large uploads run as durable background jobs (HTTP: 202 and a job to poll).

The payload is persisted with the job before the 202 (:mod:`registry.jobs`), so a crash never
loses an acknowledged upload: at the next start the job is prepared again from it and run.
A job caught *running* by the crash may already have committed: when the registry's version
moved since it started, it is reported ``done`` if the registry holds exactly what it wrote,
else ``failed`` (re-send it); it is never applied on top of a later write.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from registry.errors import ShortlistError
from registry.index.snapshot import Snapshot
from registry.jobs import JobQueue, JobRecords, Task
from registry.tools import ToolLimits, parse_tools
from registry.writes.jobs import JobState, PreparedWrite

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
    ``error`` the domain error once ``failed``."""

    id: str
    registry: str
    new_texts: int
    state: JobState = "queued"
    created_at: float = 0.0
    finished_at: float | None = None
    info: Any = None  # registry.writes.commits.RegistryInfo
    error: ShortlistError | None = None
    resumed: bool = field(default=False)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> WriteJob:
        from registry.writes.commits import RegistryInfo

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


class WriteEngine(Protocol):
    """What resuming a write needs of the engine."""

    limits: ToolLimits

    def prepare_put(self, registry: str, payload: Any) -> PreparedWrite: ...

    def prepare_upsert(self, registry: str, payload: Any) -> PreparedWrite: ...

    def current(self, registry: str) -> Snapshot | None: ...


def _error(exc: ShortlistError) -> dict[str, Any]:
    return {"type": exc.error_type, "message": exc.message, "details": exc.details}


def _info(info: Any) -> dict[str, Any] | None:
    if info is None:
        return None
    return {"registry": info.registry, "version": info.version, "tools": info.tools, "written_at": info.written_at}


def _outcome(prepared: PreparedWrite) -> Task:
    def run() -> dict[str, Any]:
        try:
            return {"state": "done", "result": _info(prepared.run())}
        except ShortlistError as exc:
            return {"state": "failed", "error": _error(exc)}

    return run


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
        record = {"registry": prepared.registry, "kind": kind, "new_texts": prepared.new_texts}
        return WriteJob.from_record(self.queue.submit(record, _outcome(prepared), raw))

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

    def resume(self, engine: WriteEngine, wrap: Callable[[PreparedWrite], PreparedWrite]) -> int:
        """Queue again the jobs a stopped process left unfinished (``wrap`` hooks each
        prepared write as :meth:`submit`'s caller does). Returns how many."""

        def version(registry: str) -> int | None:
            snap = engine.current(registry)
            return None if snap is None else snap.version

        self._version = version

        def make_task(record: dict[str, Any], raw: bytes | None) -> Task:
            registry, kind = record["registry"], record.get("kind", "put")
            if raw is None:
                return lambda: {"state": "failed", "reason": "its payload was lost"}
            payload = json.loads(raw)
            if record["state"] == "running" and record.get("before") != version(registry):
                snap = engine.current(registry)
                if holds(snap, kind, payload, engine.limits):
                    return lambda: {"state": "done", "result": _info(_snap_info(snap))}
                message = (
                    "the service stopped while this upload was being committed and registry "
                    f"{registry!r} has changed since (version {record.get('before')} -> "
                    f"{version(registry)}); it was not applied again: send it again"
                )
                error = {"type": "interrupted", "message": message, "details": {"registry": registry}}
                return lambda: {"state": "failed", "error": error}
            prepare = engine.prepare_put if kind == "put" else engine.prepare_upsert
            try:
                prepared = wrap(prepare(registry, payload))
            except ShortlistError as exc:
                failure = _error(exc)
                return lambda: {"state": "failed", "error": failure}
            return _outcome(prepared)

        return self.queue.resume(make_task)

    def close(self) -> None:
        self.queue.close()


def _snap_info(snap: Snapshot | None) -> Any:
    from registry.writes.commits import RegistryInfo

    assert snap is not None
    return RegistryInfo(snap.registry, snap.version, snap.n_tools, snap.written_at)
