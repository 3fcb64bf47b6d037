"""Crash-safe file writes and JSON-safe values, shared by the store, the feedback log, the
artifact exporters and the evaluation reports."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

TMP_PREFIX = ".tmp-"


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
