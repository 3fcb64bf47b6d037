"""Embedded default store: one directory per registry, one JSON file per version.

Layout under ``root``::

    registries/<name>/v00000007.json   newest complete version wins; older ones are pruned
    registries/.high-water/<name>      the newest version a deleted registry had reached
    embeddings/<model-key>.bin         append-only records: 32-byte content hash + float32 vector

Every version is written to a temporary file, fsynced, renamed into place and the directory
fsynced, so an acknowledged write survives a crash and a reader never sees half a file. An
embedding record is appended whole or cut back off. A full or failing disk raises
:class:`~registry.errors.StorageFull` / :class:`~registry.errors.StorageUnavailable` with
nothing changed (the embedding cache, being a cache, only logs it: see :meth:`put_embeddings`).

Version numbers are never reused, as in Redis mode: a save at or below the newest number ever
written for the name (a damaged newest file, or a deleted registry's last version, included)
raises :class:`~registry.errors.VersionConflict` and the writer retries above it. A newest
version that cannot be read is logged once, served from the one before, and listed by
:meth:`LocalStore.damaged` (``/readyz``, a metric) until a newer version replaces it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from registry.errors import VersionConflict
from registry.fsio import TMP_PREFIX, append_whole, atomic_write_bytes, fsync_dir, storage_errors
from registry.name_checks import REGISTRY_NAME_PATTERN, validate_registry_name
from registry.store import codec
from registry.store.base import RegistryRecord

_VERSION_FILE = re.compile(r"^v(\d{8,})\.json$")
_REGISTRY_DIR = re.compile(REGISTRY_NAME_PATTERN)
_KEEP_VERSIONS = 2
_HIGH_WATER = ".high-water"

log = logging.getLogger(__name__)


class LocalStore:
    """Registries and embeddings in a local directory (the embedded default)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._registries = self.root / "registries"
        self._embeddings = self.root / "embeddings"
        self._registries.mkdir(parents=True, exist_ok=True)
        self._embeddings.mkdir(parents=True, exist_ok=True)
        self._emb_lock = threading.Lock()
        self._emb_cache: dict[str, dict[bytes, np.ndarray]] = {}
        self._damaged: dict[str, str] = {}  # registry -> file name of its unreadable newest version
        self._damage_lock = threading.Lock()
        self._remove_leftovers()

    # -- registries ---------------------------------------------------------------------------

    def list_registries(self) -> list[str]:
        # A directory put there by hand under a name no client could use is not a registry.
        return sorted(
            entry.name
            for entry in self._registries.iterdir()
            if entry.is_dir() and _REGISTRY_DIR.fullmatch(entry.name) and self._versions(entry)
        )

    def load(self, registry: str) -> RegistryRecord | None:
        directory = self._directory(registry)
        if not directory.is_dir():
            return None
        damaged: list[str] = []
        found = None
        for _, path in reversed(self._versions(directory)):
            try:
                found = RegistryRecord.from_json(codec.loads(path.read_bytes()))
                break
            except (OSError, ValueError, KeyError, TypeError):
                damaged.append(path.name)  # renames are atomic, so this is disk damage
        self._note_damage(registry, damaged[0] if damaged else None, found)
        return found

    def damaged(self) -> dict[str, str]:
        """Registries whose newest version file could not be read at the last load, with that
        file's name (relative: no absolute paths leave the store)."""
        with self._damage_lock:
            return dict(self._damaged)

    def _note_damage(self, registry: str, newest: str | None, served: RegistryRecord | None) -> None:
        with self._damage_lock:
            if newest is None:
                self._damaged.pop(registry, None)
                return
            if self._damaged.get(registry) == newest:
                return  # logged already
            self._damaged[registry] = newest
        log.error(
            "registry %r: its newest version file %s is damaged (unreadable); serving %s; "
            "the next write gets a number above it", registry, newest,
            f"version {served.version}" if served is not None else "nothing",
        )

    def save(self, record: RegistryRecord) -> None:
        """Write ``record`` as the newest version.

        Raises:
            StorageFull: no space left (nothing written: the previous version stays current).
            StorageUnavailable: another I/O error (likewise).
        """
        directory = self._directory(record.registry)
        latest = self.high_water(record.registry)
        if record.version <= latest:
            raise VersionConflict(record.registry, record.version, latest)
        payload = codec.dumps(record.to_json())
        with storage_errors(f"saving version {record.version} of registry {record.registry!r}"):
            created = not directory.exists()
            directory.mkdir(parents=True, exist_ok=True)
            if created:
                fsync_dir(self._registries)
            atomic_write_bytes(directory / f"v{record.version:08d}.json", payload)
        self._note_damage(record.registry, None, record)  # a newer version supersedes the damage
        try:  # the new version is durable: failing to prune older ones must not fail the write
            for _, old in self._versions(directory)[:-_KEEP_VERSIONS]:
                old.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("registry %r: cannot prune old versions: %s", record.registry, exc)

    def delete(self, registry: str) -> bool:
        directory = self._directory(registry)
        if not directory.is_dir():
            return False
        # One atomic rename makes the delete durable; the slow removal happens after. The high
        # water goes first, so a re-created registry never reuses a number.
        trash = self._registries / f".deleted-{registry}-{uuid.uuid4().hex}"
        with storage_errors(f"deleting registry {registry!r}"):
            marks = self._registries / _HIGH_WATER
            marks.mkdir(exist_ok=True)
            atomic_write_bytes(marks / registry, str(self.high_water(registry)).encode())
            os.replace(directory, trash)
            fsync_dir(self._registries)
        self._note_damage(registry, None, None)
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def high_water(self, registry: str) -> int:
        """The newest version number ever written for ``registry`` (0: none), whether its file
        is readable, pruned by a delete, or damaged."""
        directory = self._directory(registry)
        versions = self._versions(directory) if directory.is_dir() else []
        newest = versions[-1][0] if versions else 0
        try:
            recorded = int((self._registries / _HIGH_WATER / registry).read_text().strip() or 0)
        except (OSError, ValueError):
            recorded = 0
        return max(newest, recorded)

    def _directory(self, registry: str) -> Path:
        # The name becomes a path segment: validate it here too, whatever the caller checked.
        return self._registries / validate_registry_name(registry)

    @staticmethod
    def _versions(directory: Path) -> list[tuple[int, Path]]:
        found = []
        for entry in directory.iterdir():
            match = _VERSION_FILE.match(entry.name)
            if match:
                found.append((int(match.group(1)), entry))
        return sorted(found)

    def _remove_leftovers(self) -> None:
        for entry in self._registries.iterdir():
            if entry.name.startswith(".deleted-"):
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.is_dir():
                for tmp in entry.glob(f"{TMP_PREFIX}*"):
                    tmp.unlink(missing_ok=True)

    # -- embedding cache ----------------------------------------------------------------------

    def get_embeddings(self, model_id: str, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        with self._emb_lock:
            cache = self._embedding_table(model_id)
            found = {}
            for content_hash in hashes:
                vector = cache.get(bytes.fromhex(content_hash))
                if vector is not None:
                    found[content_hash] = vector
            return found

    def put_embeddings(self, model_id: str, vectors: Mapping[str, np.ndarray]) -> None:
        """Append the vectors not cached yet (or cached with other values), as whole records
        (one write, fsynced).

        The file is a cache: when the disk refuses the append (full, or an I/O error) the file
        is cut back to its previous length, the failure is logged, and nothing is raised; the
        vectors are offered again by the next write that needs them. The registry save that
        follows meets the same disk and reports it.
        """
        if not vectors:
            return
        with self._emb_lock:
            cache = self._embedding_table(model_id)
            fresh = {bytes.fromhex(h): np.asarray(v, dtype=np.float32) for h, v in vectors.items()}
            # A record offered again with other values replaces the cached one (the last record
            # of a hash in the file wins): that is how a damaged record is repaired.
            fresh = {k: v for k, v in fresh.items() if k not in cache or not np.array_equal(cache[k], v)}
            if not fresh:
                return
            blob = b"".join(key + vector.tobytes() for key, vector in fresh.items())
            path = self._embedding_file(model_id)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    size = os.fstat(fd).st_size
                    if size < 4:  # new, or shorter than its header: start over
                        os.ftruncate(fd, 0)
                        size = 0
                        blob = next(iter(fresh.values())).shape[0].to_bytes(4, "little") + blob
                    append_whole(fd, blob, size)
                finally:
                    os.close(fd)
            except OSError as exc:
                log.warning("embedding cache %s: %d vectors not stored: %s", path, len(fresh), exc)
                return
            cache.update(fresh)

    def _embedding_file(self, model_id: str) -> Path:
        key = hashlib.sha256(model_id.encode("utf-8")).hexdigest()[:24]
        return self._embeddings / f"{key}.bin"

    def _embedding_table(self, model_id: str) -> dict[bytes, np.ndarray]:
        table = self._emb_cache.get(model_id)
        if table is not None:
            return table
        table = {}
        path = self._embedding_file(model_id)
        if path.exists():
            raw = path.read_bytes()
            table = _decode_records(raw, path)
        self._emb_cache[model_id] = table
        return table


def _decode_records(raw: bytes, path: Path) -> dict[bytes, np.ndarray]:
    """Parse the append-only embedding log; a torn tail from a crash mid-append is cut off."""
    if len(raw) < 4:
        return {}
    # The vector size is recorded implicitly: every record is hash(32) + dim*4 bytes, and the
    # file starts with a 4-byte little-endian dim header.
    dim = int.from_bytes(raw[:4], "little")
    record = 32 + 4 * dim
    body = raw[4:]
    whole = len(body) // record
    if whole * record != len(body):
        with open(path, "r+b") as handle:  # drop the torn record so later appends line up
            handle.truncate(4 + whole * record)
    table: dict[bytes, np.ndarray] = {}
    for i in range(whole):
        start = i * record
        key = body[start : start + 32]
        table[key] = np.frombuffer(body[start + 32 : start + record], dtype=np.float32).copy()
    return table
