"""Crash-safe file writes and JSON-safe values, shared by the store, the feedback log, the
artifact exporters and the evaluation reports.

Writes are whole or absent: a new file is written beside its target and renamed over it
(:func:`atomic_write_bytes`); a record appended to a log is one buffer written and fsynced, and
cut back off the file if anything fails (:func:`append_whole`). :func:`storage_errors` turns the
``OSError`` of a full or failing disk into the domain's :class:`~registry.errors.StorageFull` /
:class:`~registry.errors.StorageUnavailable`.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from registry.errors import StorageFull, StorageUnavailable

log = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-"
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def storage_error(exc: OSError, action: str) -> StorageUnavailable:
    """The domain error for an ``OSError`` met while ``action`` (e.g. "saving the registry").

    The message names the cause (no space, or the system's reason) but no server path.
    """
    code = errno.errorcode.get(exc.errno or 0, "unknown")
    details = {"operation": action, "errno": code}
    reason = exc.strerror or str(exc) or code
    if exc.errno in _FULL:
        return StorageFull(
            f"no space left in the data directory ({reason}) while {action}: "
            "nothing was changed; free space and retry",
            details,
        )
    return StorageUnavailable(
        f"the data directory cannot be written ({exc.strerror or code}) while {action}: "
        "nothing was changed; retry later",
        details,
    )


@contextmanager
def storage_errors(action: str) -> Iterator[None]:
    """Raise :func:`storage_error` for any ``OSError`` in the block (the path goes to the log)."""
    try:
        yield
    except OSError as exc:
        log.warning("storage failure while %s: %s", action, exc)
        raise storage_error(exc, action) from exc


def append_whole(fd: int, data: bytes, size: int) -> int:
    """Append ``data`` to the file open as ``fd`` (``O_APPEND``, ``size`` bytes long) whole or
    not at all: written, fsynced, and on any failure cut back to ``size``.

    Returns:
        The new size.

    Raises:
        OSError: the append failed (the file is back at ``size`` unless the truncate failed
            too, which is logged; readers of an append-only log drop a torn tail).
    """
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        try:
            os.ftruncate(fd, size)
        except OSError:
            log.exception("cannot cut a failed append back to %d bytes", size)
        raise
    return size + len(data)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (a no-op where directories can't be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new one, never a mix.

    A temporary file (named ``.tmp-<name>-*`` in the same directory) is written, fsynced and
    renamed over ``path``; then the directory is fsynced so the rename itself survives.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def json_safe(obj: Any, digits: int | None = None) -> Any:
    """A JSON-serialisable copy for artifacts and reports.

    numpy scalars become Python numbers, tuples lists, non-finite floats the strings ``"inf"``
    / ``"nan"``, anything else unknown its ``str``; floats are rounded to ``digits`` if given.
    """
    if isinstance(obj, dict):
        return {str(k): json_safe(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v, digits) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return str(obj)
        return round(obj, digits) if digits is not None else obj
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)
