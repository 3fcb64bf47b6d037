"""The commit half of the engine's write path: sync with the store, derive, persist, install.

:class:`CommitPath` is mixed into :class:`registry.writes.engine.ShortlistEngine`; the prepared
writes, group commit and write jobs it uses live in :mod:`registry.writes.jobs`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from registry.errors import ShortlistError, ValidationFailed, VersionConflict
from registry.index.embed import Embedder
from registry.index.graph import NO_EDITS, EdgeEdits
from registry.index.snapshot import Snapshot, build_snapshot
from registry.names import validate_registry_name
from registry.runtime import trim_heap
from registry.settings import EngineArgs
from registry.store.base import RegistryRecord, SharedStore, Store
from registry.tools import Tool, ToolLimits
from registry.writes.jobs import (
    Change,
    GroupCommit,
    PendingWrite,
    apply_group,
    stored_tools,
)

log = logging.getLogger("registry.writes.engine")

# A write that loses a version race resynchronises and tries again, this many times in all,
# after a random pause that grows with each attempt up to a cap (so racing replicas spread
# out; a retry only re-derives the snapshot, which is cheap).
MAX_WRITE_ATTEMPTS = 12
CONFLICT_BACKOFF_SECONDS = 0.01
MAX_BACKOFF_SECONDS = 0.25


@dataclass(frozen=True, slots=True)
class RegistryInfo:
    registry: str
    version: int
    tools: int
    written_at: float | None = None  # Unix time this version was written (None: unknown)


@dataclass(frozen=True, slots=True)
class RegistryChange:
    """A registry brought in line with the store: new version installed, or deleted (``info``
    is None). Reported for changes made elsewhere (another replica), not for this engine's own
    writes."""

    registry: str
    info: RegistryInfo | None


RegistryListener = Callable[[RegistryChange], None]


class CommitPath:
    """Snapshots, locks and the commit path of an engine (see ShortlistEngine)."""

    settings: EngineArgs
    store: Store
    embedder: Embedder
    limits: ToolLimits
    _snapshots: dict[str, Snapshot]
    _locks: dict[str, threading.Lock]
    _locks_guard: threading.Lock
    _swap_lock: threading.Lock
    _group: GroupCommit
    _shared: bool
    _listeners: list[RegistryListener]
    _unloadable: dict[str, int]

    def _lock(self, registry: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(registry, threading.Lock())

    def _next_version(self, registry: str, current: Snapshot | None) -> int:
        if current is not None:
            return current.version + 1
        stored = self.store.load(registry)
        if stored is not None and self._shared:
            # Another replica created the registry after our sync: building on "absent" would
            # overwrite it (an upsert would lose its tools, a create would happen twice).
            raise VersionConflict(registry, stored.version, stored.version)
        return stored.version + 1 if stored else 1

    def _build(
        self, registry: str, version: int, tools: list[Tool], equivalents: Any, edits: EdgeEdits = NO_EDITS
    ) -> Snapshot:
        snap = build_snapshot(
            registry,
            version,
            tools,
            self.embedder,
            self.store,
            hnsw_min_tools=self.settings.hnsw_min_tools,
            equivalents=equivalents,
            previous=self._snapshots.get(registry),
            edits=edits,
        )
        trim_heap()  # embedding batches leave hundreds of MB of freed heap behind
        return snap

    def _commit(
        self, registry: str, version: int, tools: list[Tool], equivalents: Any, edits: EdgeEdits = NO_EDITS
    ) -> RegistryInfo:
        written_at = time.time()
        snap = replace(self._build(registry, version, tools, equivalents, edits), written_at=written_at)
        self.store.save(
            RegistryRecord(
                registry=registry,
                version=version,
                tools=[t.definition for t in tools],
                equivalents=[list(g) for g in equivalents],
                embedder=self.embedder.model_id,
                written_at=written_at,
                edges=edits.to_json() if edits else {},
            )
        )
        self._install(snap)
        return RegistryInfo(registry, version, len(tools), written_at)

    def _apply(self, registry: str, change: Change) -> RegistryInfo:
        """:meth:`_write` for a change that always writes."""
        info = self._write(registry, change)
        assert info is not None
        return info

    def _write(self, registry: str, change: Change) -> RegistryInfo | None:
        """Apply ``change`` to the registry's current version and commit the result.

        ``change`` returning ``None`` means "nothing to write" (checked against the synced
        state): nothing is committed and ``None`` is returned. Writes to one registry that
        queue behind each other are applied in arrival order and committed together as one
        version (:class:`registry.writes.jobs.GroupCommit`); each still gets its own errors.
        """
        info: RegistryInfo | None = self._group.write(registry, change, self._commit_group)
        return info

    def _commit_group(self, registry: str, group: list[PendingWrite]) -> None:
        """Commit queued writes as one version (the registry's lock is held).

        With a shared store the current snapshot is first brought in line with the store, and a
        commit that loses a version race (another replica saved first) is redone on top of the
        winner's version, after a short random pause.
        """
        floor = 0
        conflict: VersionConflict | None = None
        for attempt in range(MAX_WRITE_ATTEMPTS):
            if attempt:
                pause = min(MAX_BACKOFF_SECONDS, CONFLICT_BACKOFF_SECONDS * 2**attempt)
                time.sleep(random.uniform(0, pause))
            if self._shared:
                self._sync_locked(registry)
            current = self._snapshots.get(registry)
            try:
                version = max(self._next_version(registry, current), floor)
                draft, outcomes = apply_group(current, group)
                info = None
                if draft is not None:
                    info = self._commit(registry, version, list(draft.tools), draft.equivalents, draft.edits)
            except VersionConflict as exc:
                log.info("registry %r: %s", registry, exc.message)
                conflict = exc
                floor = exc.latest + 1
                continue
            for pending, outcome in outcomes:
                if isinstance(outcome, ShortlistError):
                    pending.settle(error=outcome)
                else:
                    pending.settle(info if outcome else None)
            return
        assert conflict is not None
        raise conflict

    def _sync_locked(self, registry: str) -> RegistryChange | None:
        current = self._snapshots.get(registry)
        if isinstance(self.store, SharedStore):
            stored_version = self.store.version(registry)
            if current is not None and current.version == stored_version:
                return None
            record = self.store.load(registry) if stored_version is not None else None
        else:
            try:
                validate_registry_name(registry)
            except ValidationFailed:
                return None  # never let an invalid name reach a path-based store
            record = self.store.load(registry)
        if record is None:
            if current is None:
                return None
            self._remove(registry)
            return self._notify(RegistryChange(registry, None))
        if current is not None and current.version == record.version:
            return None
        tools = stored_tools(record.tools, current, self.limits)
        snap = self._build(
            registry, record.version, tools, record.equivalents, EdgeEdits.from_json(record.edges)
        )
        self._install(replace(snap, written_at=record.written_at))
        self._unloadable.pop(registry, None)
        return self._notify(
            RegistryChange(
                registry, RegistryInfo(registry, record.version, len(tools), record.written_at)
            )
        )

    def _notify(self, change: RegistryChange) -> RegistryChange:
        log.info(
            "registry %r %s from the store",
            change.registry,
            f"version {change.info.version} installed" if change.info else "deleted",
        )
        for listener in self._listeners:
            try:
                listener(change)
            except Exception:
                log.exception("registry listener %r failed", listener)
        return change

    def _install(self, snap: Snapshot) -> None:
        with self._swap_lock:
            snapshots = dict(self._snapshots)
            snapshots[snap.registry] = snap
            self._snapshots = snapshots  # one reference swap: readers see old or new, never half

    def _remove(self, registry: str) -> None:
        with self._swap_lock:
            snapshots = dict(self._snapshots)
            snapshots.pop(registry, None)
            self._snapshots = snapshots

