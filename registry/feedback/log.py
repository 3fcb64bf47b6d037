"""The local durable feedback log (JSON Lines under the data directory) and its compaction; the
log contracts every backend implements are :mod:`registry.feedback.log_protocol`."""

from __future__ import annotations

import gzip
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from registry.errors import ArtifactError
from registry.feedback.counts import ToolEfficiency
from registry.feedback.events import FeedbackEvent, event_line
from registry.feedback.log_protocol import CHECKPOINT_FORMAT, LogCompacted, parse_checkpoint
from registry.fsio import append_whole, atomic_write_bytes, fsync_dir, storage_errors

logger = logging.getLogger(__name__)

_GENERATION_KEY = "log_generation"  # the header line of a compacted log


class LocalFeedbackLog:
    """Feedback events as JSON Lines in one local file (one writer process per file).

    Each append writes one line and fsyncs it under a lock; a failed append is cut back
    off the file (a full disk raises :class:`~registry.errors.StorageFull`). A crash
    mid-append can leave a torn last line (no trailing newline): opening
    the log truncates it away so later appends stay parseable, and :meth:`replay` skips any
    line it cannot parse (with a warning).

    Compaction keeps the file bounded. :meth:`compact` folds the events received before a
    cutoff into ``checkpoint.json`` (their tool-efficiency counts, :meth:`checkpoint_state`)
    and rewrites the log without them; the rewritten file starts with a header line
    ``{"log_generation": G}``. The checkpoint records the generation and byte offset it
    covers, and every step is an atomic rename, so a crash at any point leaves either the old
    log with a checkpoint covering its first bytes, or the new log with a checkpoint covering
    exactly what was cut: no event is lost or counted twice.

    The events a compaction cuts are not thrown away: with ``archive`` (the default) they are
    first written, byte for byte, to ``archive/events-<generation>-<offset>.jsonl.gz`` next
    to the log (the data for retraining), off the start-up replay path.

    Args:
        path: the ``.jsonl`` file; parent directories are created. The checkpoint lives next
            to it as ``checkpoint.json``.
        archive: keep the compacted events in gzipped archive files (``False``: drop them;
            their counts are in the checkpoint either way).

    Raises:
        ArtifactError: the checkpoint is unreadable or does not belong to this log (e.g. a
            compacted log whose checkpoint was deleted): counts would be wrong, so the log
            refuses to open.
    """

    def __init__(self, path: Path | str, *, archive: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.checkpoint_path = self.path.with_name("checkpoint.json")
        self.archive_dir: Path | None = self.path.with_name("archive") if archive else None
        self._rewrite_path = self.path.with_name(self.path.name + ".compacting")
        self._lock = threading.Lock()
        self._compact_lock = threading.Lock()
        self.skipped = 0  # unparseable lines met by the last replay()
        created = not self.path.exists()
        self._rewrite_path.unlink(missing_ok=True)  # a compaction interrupted before its rename
        self._truncate_torn_tail()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        if created:
            fsync_dir(self.path.parent)
        self._generation, header = self._read_header()
        self._checkpoint = self._read_checkpoint()
        self._start = self._replay_start(header)
        self._pending = sum(1 for _ in self._lines(self._start, self._size))

    @classmethod
    def in_data_dir(cls, data_dir: Path | str, *, archive: bool = True) -> LocalFeedbackLog:
        """The log at ``<data_dir>/feedback/events.jsonl``."""
        return cls(Path(data_dir) / "feedback" / "events.jsonl", archive=archive)

    # -- opening ----------------------------------------------------------------------------------

    def _read_header(self) -> tuple[int, int]:
        """``(generation, header bytes)``; a log never compacted has no header: ``(0, 0)``."""
        with open(self.path, "rb") as handle:
            first = handle.readline()
        if not first.endswith(b"\n"):
            return 0, 0
        try:
            doc = json.loads(first)
        except ValueError:
            return 0, 0
        if isinstance(doc, dict) and set(doc) == {_GENERATION_KEY} and isinstance(doc[_GENERATION_KEY], int):
            return int(doc[_GENERATION_KEY]), len(first)
        return 0, 0

    def _read_checkpoint(self) -> dict[str, Any] | None:
        try:
            raw = self.checkpoint_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ArtifactError(f"cannot read feedback checkpoint {self.checkpoint_path}: {exc}") from exc
        return parse_checkpoint(
            raw,
            str(self.checkpoint_path),
            lambda doc: (int(doc[_GENERATION_KEY]), int(doc["log_offset"])),
            {"path": str(self.checkpoint_path)},
        )

    def _replay_start(self, header: int) -> int:
        """Byte offset of the first event the checkpoint does not already count."""
        ck = self._checkpoint
        if ck is None:
            if self._generation == 0:
                return header
            raise ArtifactError(
                f"feedback log {self.path} is compacted (generation {self._generation}) but its "
                f"checkpoint {self.checkpoint_path} is missing: the counts of the compacted "
                "events would be lost; restore the checkpoint or move the log away",
                {"path": str(self.checkpoint_path)},
            )
        generation, offset = int(ck[_GENERATION_KEY]), int(ck["log_offset"])
        if generation == self._generation - 1:  # the rewrite landed: all of this file is new
            return header
        if generation == self._generation and header <= offset <= self._size:
            return offset
        raise ArtifactError(
            f"feedback checkpoint {self.checkpoint_path} (generation {generation}, offset {offset}) "
            f"does not belong to log {self.path} (generation {self._generation}, {self._size} bytes)",
            {"path": str(self.checkpoint_path)},
        )

    def _truncate_torn_tail(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "r+b") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size == 0:
                return
            # Scan back for the last newline; a torn line is at most one event long.
            chunk = 64 * 1024
            end = size
            while end > 0:
                start = max(0, end - chunk)
                handle.seek(start)
                data = handle.read(end - start)
                pos = data.rfind(b"\n")
                if pos >= 0:
                    keep = start + pos + 1
                    break
                end = start
            else:
                keep = 0
            if keep < size:
                logger.warning(
                    "feedback log %s: dropping a torn last line (%d bytes)", self.path, size - keep
                )
                handle.truncate(keep)
                handle.flush()
                os.fsync(handle.fileno())

    # -- the log ----------------------------------------------------------------------------------

    def append(self, event: FeedbackEvent) -> None:
        """Write one line, whole or not at all (a failed append is cut back off the file).

        Raises:
            StorageFull: no space left; nothing was recorded, a retry is accepted.
            StorageUnavailable: another I/O error (likewise).
        """
        data = event_line(event)
        with self._lock:
            fd = self._fd
            if fd is None:
                raise ValueError(f"feedback log {self.path} is closed")
            with storage_errors("recording feedback"):
                self._size = append_whole(fd, data, self._size)
            self._pending += 1

    def checkpoint_state(self) -> dict[str, Any] | None:
        """Tool-efficiency counts of the compacted events (:meth:`ToolEfficiency.to_state`),
        or ``None`` when the log was never compacted. :meth:`replay` yields the rest."""
        return None if self._checkpoint is None else self._checkpoint["efficiency"]

    def pending_events(self) -> int:
        """Lines after the checkpoint: what a restart replays."""
        with self._lock:
            return self._pending

    def pending_bytes(self) -> int:
        """Bytes of the log after the checkpoint."""
        with self._lock:
            return self._size - self._start

    def _lines(self, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        """``(offset after the line, line)`` for the lines in ``[start, end)``; only the last
        one can lack its newline (a torn tail written by someone else)."""
        with open(self.path, "rb") as handle:
            handle.seek(start)
            pos = start
            for raw in handle:
                if pos + len(raw) > end:  # appended after the caller looked at the size
                    return
                pos += len(raw)
                yield pos, raw

    def replay(self) -> Iterator[FeedbackEvent]:
        """Every event after the checkpoint, oldest first."""
        with self._lock:
            size = self._size if self._fd is not None else os.path.getsize(self.path)
            start = self._start
        skipped = 0
        for _, raw in self._lines(start, size):
            if not raw.endswith(b"\n"):
                skipped += 1
                break
            try:
                yield FeedbackEvent.from_json(json.loads(raw))
            except (ValueError, KeyError, TypeError) as exc:
                skipped += 1
                logger.warning("feedback log %s: skipping unreadable line: %s", self.path, exc)
        self.skipped = skipped

    def read_after(self, position: Any = None) -> tuple[list[FeedbackEvent], Any]:
        """The events after ``position`` (from a previous call; None: after the checkpoint),
        oldest first, and the position after them: a reader keeping up with the log reads each
        line once instead of replaying the whole log every time.

        Raises:
            LogCompacted: a compaction cut events since ``position`` was taken (read again from
                None: :meth:`replay` no longer yields the events cut).
        """
        with self._lock:
            size, start, generation = self._size, self._start, self._generation
            if position is None:
                offset = start
            elif tuple(position[:2]) != (generation, start):
                raise LogCompacted(f"feedback log {self.path} was compacted since the last read")
            else:
                offset = int(position[2])
            handle = open(self.path, "rb")  # noqa: SIM115 - opened under the lock (this generation), read outside it
        events: list[FeedbackEvent] = []
        with handle:
            handle.seek(offset)
            pos = offset
            for raw in handle:
                if pos + len(raw) > size or not raw.endswith(b"\n"):
                    break  # appended after the size was read, or a torn tail
                pos += len(raw)
                try:
                    events.append(FeedbackEvent.from_json(json.loads(raw)))
                except (ValueError, KeyError, TypeError):
                    continue  # replay skips (and reports) it too
        return events, (generation, start, pos)

    def compact(self, cutoff: float) -> int:
        """Fold the events received before ``cutoff`` (epoch seconds) into the checkpoint and
        rewrite the log without them. Appends may continue meanwhile (they wait only for the
        final rename). Stops at the first event at or after ``cutoff``, so what stays is a
        suffix of the log.

        Returns:
            The number of events folded (0 and nothing written when no event is older).

        Raises:
            OSError: writing failed; the log and checkpoint are still consistent.
        """
        with self._compact_lock:
            with self._lock:
                if self._fd is None:
                    raise ValueError(f"feedback log {self.path} is closed")
                size, start, generation = self._size, self._start, self._generation
            counts = ToolEfficiency.from_state(self.checkpoint_state() or {})
            cut, folded, lines = self._fold_prefix(start, size, cutoff, counts)
            if cut == start:
                return 0
            if self.archive_dir is not None:
                # 0. The cut events, before anything forgets them. Named by where they start, so
                #    a compaction re-run after a crash replaces this file instead of adding one.
                self._archive(generation, start, cut)
            # 1. The checkpoint now covers [0, cut) of this generation: a crash from here on
            #    replays from `cut` (the old file) or all of the new file (after the rewrite).
            self._save_checkpoint(generation, cut, folded, counts, lines)
            # 2 and 3. The new file beside the log, then the rename.
            self._rewrite(generation, cut, size)
            logger.info("feedback log %s: compacted %d events into %s", self.path, folded, self.checkpoint_path)
            return folded

    def _fold_prefix(
        self, start: int, size: int, cutoff: float, counts: ToolEfficiency
    ) -> tuple[int, int, int]:
        """Count the events from ``start`` up to the first one at or after ``cutoff`` into
        ``counts``; returns ``(cut offset, events folded, lines cut)``."""
        cut, folded, lines = start, 0, 0
        for end, raw in self._lines(start, size):
            if not raw.endswith(b"\n"):
                break
            try:
                event = FeedbackEvent.from_json(json.loads(raw))
            except (ValueError, KeyError, TypeError):
                cut, lines = end, lines + 1  # unreadable: replay skips it too; drop it
                continue
            if event.received >= cutoff:
                break
            counts.add(event)
            cut, folded, lines = end, folded + 1, lines + 1
        return cut, folded, lines

    def _save_checkpoint(
        self, generation: int, cut: int, folded: int, counts: ToolEfficiency, lines: int
    ) -> None:
        checkpoint = {
            "format": CHECKPOINT_FORMAT,
            _GENERATION_KEY: generation,
            "log_offset": cut,
            "events_folded": int((self._checkpoint or {}).get("events_folded", 0)) + folded,
            "efficiency": counts.to_state(),
        }
        atomic_write_bytes(
            self.checkpoint_path,
            json.dumps(checkpoint, separators=(",", ":"), allow_nan=False).encode("utf-8"),
        )
        with self._lock:
            self._checkpoint, self._start = checkpoint, cut
            self._pending -= lines

    def _rewrite(self, generation: int, cut: int, size: int) -> None:
        """Write header + the log from ``cut`` as the next generation and rename it over the
        log; appends wait only while the last bytes are copied and the file is swapped."""
        header = (json.dumps({_GENERATION_KEY: generation + 1}) + "\n").encode("utf-8")
        with open(self._rewrite_path, "wb") as out, open(self.path, "rb") as src:
            out.write(header)
            src.seek(cut)
            copied, kept = cut, 0
            while copied < size:
                chunk = src.read(min(1 << 20, size - copied))
                if not chunk:
                    break
                out.write(chunk)
                copied += len(chunk)
                kept += chunk.count(b"\n")
            with self._lock:  # what was appended meanwhile, then the rename
                src.seek(size)
                tail = src.read(self._size - size)
                out.write(tail)
                kept += tail.count(b"\n")
                out.flush()
                os.fsync(out.fileno())
                os.replace(self._rewrite_path, self.path)
                fsync_dir(self.path.parent)
                old_fd = self._fd
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
                if old_fd is not None:
                    os.close(old_fd)
                self._size = os.fstat(self._fd).st_size
                self._generation, self._start = generation + 1, len(header)
                self._pending = kept

    def _archive(self, generation: int, start: int, end: int) -> None:
        assert self.archive_dir is not None
        self.archive_dir.mkdir(exist_ok=True)
        with open(self.path, "rb") as src:
            src.seek(start)
            data = src.read(end - start)
        name = f"events-{generation:06d}-{start:012d}.jsonl.gz"
        atomic_write_bytes(self.archive_dir / name, gzip.compress(data, compresslevel=6, mtime=0))

    def archived_events(self) -> Iterator[FeedbackEvent]:
        """Every archived (compacted) event, oldest first (e.g. to build training data)."""
        if self.archive_dir is None or not self.archive_dir.is_dir():
            return
        for file in sorted(self.archive_dir.glob("events-*.jsonl.gz")):
            for raw in gzip.decompress(file.read_bytes()).splitlines():
                try:
                    yield FeedbackEvent.from_json(json.loads(raw))
                except (ValueError, KeyError, TypeError):
                    continue

    def close(self) -> None:
        """Close the file (idempotent); :meth:`replay` still works, :meth:`append` does not."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> LocalFeedbackLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


