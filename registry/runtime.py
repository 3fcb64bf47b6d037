"""Process-level tuning for a serving process: thread pools and the C heap."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_ARENA_MAX = -8  # glibc mallopt parameter


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


_LIBC = _libc()


def limit_native_threads() -> None:
    """One BLAS/OpenMP thread per call, set before numpy loads.

    Requests already run in parallel on worker threads; a multi-threaded BLAS inside each of
    them oversubscribes the cores (measured: the hybrid search stage went from 0.3 ms to 59 ms
    mean at 8 concurrent requests on 2 cores).
    """
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's per-thread heaps: with one per worker thread, freed memory stays resident."""
    if _LIBC is not None and hasattr(_LIBC, "mallopt"):  # glibc only (musl has no mallopt)
        _LIBC.mallopt(_M_ARENA_MAX, arenas)


def trim_heap() -> None:
    """Give freed heap pages back to the OS (after an index build frees its temporaries).

    Measured after embedding 4,000 tools: RSS 543 MB before, 301 MB after.
    """
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):  # a glibc extension
        _LIBC.malloc_trim(0)
