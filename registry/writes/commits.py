"""How a write commits: sync with the store, derive, persist, install.

:class:`CommitPath` is what :class:`registry.writes.writer.RegistryWriter` hands a validated
change to: per-registry locks, group commit, version races with other replicas, and the swap
into the :class:`~registry.snapshots.Snapshots` map queries read. The prepared writes and group
commit it uses live in :mod:`registry.writes.prepared`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import replace
from typing import Any

from registry.errors import ShortlistError, ValidationFailed, VersionConflict
from registry.index.embed import Embedder
from registry.index.graph_edits import NO_EDITS, EdgeEdits
from registry.index.snapshot import Snapshot, build_snapshot
from registry.name_checks import validate_registry_name
from registry.runtime import trim_heap
from registry.settings import EngineArgs
from registry.snapshots import RegistryChange, RegistryInfo, RegistryListener, Snapshots
from registry.store.base import RegistryRecord, SharedStore, Store
from registry.tools import Tool, ToolLimits
from registry.writes.prepared import (
    Change,
    GroupCommit,
    PendingWrite,
    apply_group,
    stored_tools,
)

log = logging.getLogger("registry.writes.writer")

# A write that loses a version race resynchronises and tries again, this many times in all,
# after a random pause that grows with each attempt up to a cap (so racing replicas spread
# out; a retry only re-derives the snapshot, which is cheap).
MAX_WRITE_ATTEMPTS = 12
CONFLICT_BACKOFF_SECONDS = 0.01
MAX_BACKOFF_SECONDS = 0.25


class CommitPath:
    """Locks, group commit and the swap of one replica's registries.

    Args:
        settings: ``hnsw_min_tools`` (when a snapshot gets an HNSW index).
        store: where versions are persisted (a :class:`SharedStore`: several replicas).
        embedder: embeds the texts a new version brings (most are cached by then).
        snapshots: the map this path installs into.
        limits: what a stored version may hold.
    """

    def __init__(
        self, settings: EngineArgs, store: Store, embedder: Embedder, snapshots: Snapshots, limits: ToolLimits
    ) -> None:
        self.settings = settings
        self.store = store
        self.embedder = embedder
        self.snapshots = snapshots
        self.limits = limits
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._group = GroupCommit(self.lock)  # queued writes to a registry commit together
        self.shared = isinstance(store, SharedStore)
        self.listeners: list[RegistryListener] = []
        self.unloadable: dict[str, int] = {}  # registry -> stored version that failed to load

    def lock(self, registry: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(registry, threading.Lock())

    def _next_version(self, registry: str, current: Snapshot | None) -> int:
        if current is not None:
            return current.version + 1
        stored = self.store.load(registry)
        if stored is not None and self.shared:
            # Another replica created the registry after our sync: building on "absent" would
            # overwrite it (an upsert would lose its tools, a create would happen twice).
            raise VersionConflict(registry, stored.version, stored.version)
        return stored.version + 1 if stored else 1

    def build(
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
            previous=self.snapshots.current(registry),
            edits=edits,
        )
        trim_heap()  # embedding batches leave hundreds of MB of freed heap behind
        return snap

    def _commit(
        self, registry: str, version: int, tools: list[Tool], equivalents: Any, edits: EdgeEdits = NO_EDITS
    ) -> RegistryInfo:
        written_at = time.time()
        snap = replace(self.build(registry, version, tools, equivalents, edits), written_at=written_at)
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
        self.snapshots.install(snap)
        return RegistryInfo(registry, version, len(tools), written_at)

    def apply(self, registry: str, change: Change) -> RegistryInfo:
        """:meth:`write` for a change that always writes."""
        info = self.write(registry, change)
        assert info is not None
        return info

    def write(self, registry: str, change: Change) -> RegistryInfo | None:
        """Apply ``change`` to the registry's current version and commit the result.

        ``change`` returning ``None`` means "nothing to write" (checked against the synced
        state): nothing is committed and ``None`` is returned. Writes to one registry that
        queue behind each other are applied in arrival order and committed together as one
        version (:class:`registry.writes.prepared.GroupCommit`); each still gets its own errors.
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
            if self.shared:
                self.sync_locked(registry)
            current = self.snapshots.current(registry)
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

    def sync_locked(self, registry: str) -> RegistryChange | None:
        current = self.snapshots.current(registry)
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
            self.snapshots.remove(registry)
            return self._notify(RegistryChange(registry, None))
        if current is not None and current.version == record.version:
            return None
        tools = stored_tools(record.tools, current, self.limits)
        snap = self.build(
            registry, record.version, tools, record.equivalents, EdgeEdits.from_json(record.edges)
        )
        self.snapshots.install(replace(snap, written_at=record.written_at))
        self.unloadable.pop(registry, None)
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
        for listener in self.listeners:
            try:
                listener(change)
            except Exception:
                log.exception("registry listener %r failed", listener)
        return change
