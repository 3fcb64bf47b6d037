"""The registry name -> current :class:`~registry.index.snapshot.Snapshot` map both paths share.

Queries (:mod:`registry.serving`) read a registry's snapshot once, without a lock; writes
(:mod:`registry.writes`) build a new snapshot off to the side and :meth:`Snapshots.install` it:
the whole mapping is replaced under a lock held only by writers, so a reader sees the old
version or the new one, never half of either.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from registry.errors import RegistryNotFound
from registry.index.snapshot import Snapshot

__all__ = ["RegistryChange", "RegistryInfo", "RegistryListener", "RegistryListeners", "Snapshots"]


@dataclass(frozen=True, slots=True)
class RegistryInfo:
    registry: str
    version: int
    tools: int
    written_at: float | None = None  # Unix time this version was written (None: unknown)


@dataclass(frozen=True, slots=True)
class RegistryChange:
    """A registry brought in line with the store: new version installed, or deleted (``info``
    is None). Reported for changes made elsewhere (another replica), not for this replica's own
    writes."""

    registry: str
    info: RegistryInfo | None


RegistryListener = Callable[[RegistryChange], None]


class RegistryListeners:
    """The core's registry listeners, called in order with every change (a listener of its own,
    built before the parts that report changes, so they are handed it at construction)."""

    def __init__(self) -> None:
        self._listeners: list[RegistryListener] = []

    def add(self, listener: RegistryListener) -> None:
        self._listeners.append(listener)

    def __call__(self, change: RegistryChange) -> None:
        for listener in self._listeners:
            listener(change)


class Snapshots:
    """The current snapshot of every registry this replica serves."""

    def __init__(self) -> None:
        self._map: dict[str, Snapshot] = {}
        self._swap_lock = threading.Lock()  # writers of different registries; readers never lock

    def current(self, registry: str) -> Snapshot | None:
        """The registry's current snapshot, or None."""
        return self._map.get(registry)

    def snapshot(self, registry: str) -> Snapshot:
        """The registry's current snapshot (raises :class:`RegistryNotFound`)."""
        snap = self._map.get(registry)
        if snap is None:
            raise RegistryNotFound(registry)
        return snap

    def has_registry(self, registry: str) -> bool:
        return registry in self._map

    def names(self) -> list[str]:
        return list(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def list_registries(self) -> list[RegistryInfo]:
        snapshots = self._map
        return [
            RegistryInfo(s.registry, s.version, s.n_tools, s.written_at)
            for s in sorted(snapshots.values(), key=lambda s: s.registry)
        ]

    def install(self, snap: Snapshot) -> None:
        with self._swap_lock:
            snapshots = dict(self._map)
            snapshots[snap.registry] = snap
            self._map = snapshots  # one reference swap: readers see old or new, never half

    def remove(self, registry: str) -> None:
        with self._swap_lock:
            snapshots = dict(self._map)
            snapshots.pop(registry, None)
            self._map = snapshots
