"""Where durable job records and payloads live: the data directory (here), or the shared Redis
(:mod:`registry.store.redis_job_records`).

A record is a JSON object with ``id``, ``state`` (``queued``, ``running``, then a final state)
and ``created``; a payload is bytes (an upload's body). :mod:`registry.job_queue` runs the jobs.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from registry.fsio import atomic_write_bytes, storage_errors

__all__ = ["FINISHED_TTL_SECONDS", "OPEN_STATES", "JobRecords", "LocalJobRecords"]

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
