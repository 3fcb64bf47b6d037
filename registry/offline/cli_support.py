"""Shared by the command-line tools (``shortlist train``/``evaluate``): ``--help`` without
reStructuredText and with defaults, and progress lines for steps that take more than a moment."""

from __future__ import annotations

import argparse
import inspect
import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not at run time: `shortlist serve` caps BLAS threads before numpy loads
    from registry.index.embed import Embedder, FloatArray

HEARTBEAT_SECONDS = 10.0
"""A running step logs 'still running' this often."""

_ROLE = re.compile(r":[a-z]+:`(~?)([^`<]+?)(?:\s*<[^>]+>)?`")


def plain(doc: str | None) -> str:
    """``doc`` as ``--help`` shows it: dedented, Sphinx roles and double backticks removed."""

    def role(match: re.Match[str]) -> str:
        target = match.group(2).strip()
        return target.rsplit(".", 1)[-1] if match.group(1) else target

    return _ROLE.sub(role, inspect.cleandoc(doc or "")).replace("``", "")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's paragraphs and appends ``(default: X)`` to every option whose
    default is a value (not None, not a flag's False) and whose help does not already say it
    (what ``ArgumentDefaultsHelpFormatter`` does, minus ``(default: None)``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or action.required
            or default is None
            or default is False
            or default in ((), [])
            or default is argparse.SUPPRESS
            or "default" in text
        ):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        shown = shown.replace("%", "%%")  # argparse %-formats help strings
        return f"{text} (default: {shown})" if text else f"(default: {shown})"


@contextmanager
def progress_step(
    log: logging.Logger,
    what: str,
    *,
    expected_seconds: float | None = None,
    heartbeat: float = HEARTBEAT_SECONDS,
) -> Iterator[None]:
    """Log ``what...`` now, ``what: still running (N s[ of about M s])`` every ``heartbeat``
    seconds, and ``what: done in N s`` at the end (a thread logs the heartbeat; the work is
    untouched). ``expected_seconds`` is an estimate to show beside the elapsed time."""
    about = f" of about {expected_seconds:.0f} s" if expected_seconds else ""
    log.info("%s%s...", what, f" (about {expected_seconds:.0f} s)" if expected_seconds else "")
    start = time.perf_counter()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(heartbeat):
            log.info("%s: still running (%.0f s%s)", what, time.perf_counter() - start, about)

    thread = threading.Thread(target=beat, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    log.info("%s: done in %.1f s", what, time.perf_counter() - start)


class ProgressEmbedder:
    """An :class:`Embedder` whose large ``embed_documents`` calls are logged as a :func:`progress_step`.

    The texts go to the wrapped embedder in one call, as without the wrapper, so the vectors
    are bitwise the same (chunking would regroup the length-sorted batches); so the line gives
    elapsed time and an estimate (characters per second of the previous call), not a share done.
    """

    def __init__(
        self, inner: Embedder, log: logging.Logger, *, label: str = "texts", min_texts: int = 1000
    ) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self._log = log
        self._label = label
        self._min_texts = min_texts
        self._chars_per_second: float | None = None

    def embed_query(self, text: str) -> FloatArray:
        return self.inner.embed_query(text)

    def embed_documents(self, texts: Sequence[str], batch_size: int = 32) -> FloatArray:
        chars = sum(len(t) for t in texts)
        start = time.perf_counter()
        if len(texts) < self._min_texts:
            out = self.inner.embed_documents(texts, batch_size)
        else:
            expected = chars / self._chars_per_second if self._chars_per_second else None
            what = f"embedding {len(texts):,} {self._label}"
            with progress_step(self._log, what, expected_seconds=expected):
                out = self.inner.embed_documents(texts, batch_size)
        elapsed = time.perf_counter() - start
        if chars and elapsed > 0.05:  # too short a call says little about the rate
            self._chars_per_second = chars / elapsed
        return out
