"""The storage interface. The local directory store is the embedded default; Redis is shared.

``Store`` is what one process needs. ``SharedStore`` adds what replicas sharing one store need
to stay in step: cheap version lookups and change notifications.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class RegistryRecord:
    """One durable registry version: the tool definitions exactly as uploaded."""

    registry: str
    version: int
    tools: list[dict[str, Any]]
    equivalents: list[list[str]] = field(default_factory=list)
    written_at: float | None = None  # Unix time of the write; None in records from before it
    embedder: str | None = None  # model_id of the embedder it was built with (None: older record)
    edges: dict[str, Any] = field(default_factory=dict)  # admin edits of the graph (EdgeEdits)

    def to_json(self) -> dict[str, Any]:
        return {
            "registry": self.registry,
            "version": self.version,
            "tools": self.tools,
            "equivalents": self.equivalents,
            "written_at": self.written_at,
            "embedder": self.embedder,
            "edges": self.edges,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RegistryRecord:
        return cls(
            registry=str(data["registry"]),
            version=int(data["version"]),
            tools=list(data["tools"]),
            equivalents=[list(group) for group in data.get("equivalents", [])],
            written_at=float(data["written_at"]) if data.get("written_at") is not None else None,
            embedder=data.get("embedder"),
            edges=dict(data.get("edges") or {}),
        )


class Store(Protocol):
    """Durable home of registries and of the embedding cache.

    ``save`` returns only once the version is durable: a crash at any moment leaves either the
    previous version or the new one, never a torn or empty registry.
    """

    def list_registries(self) -> list[str]: ...

    def load(self, registry: str) -> RegistryRecord | None: ...

    def save(self, record: RegistryRecord) -> None: ...

    def delete(self, registry: str) -> bool: ...

    def get_embeddings(self, model_id: str, hashes: Sequence[str]) -> dict[str, np.ndarray]: ...

    def put_embeddings(self, model_id: str, vectors: Mapping[str, np.ndarray]) -> None: ...


@runtime_checkable
class SharedStore(Store, Protocol):
    """A store several replicas write to at once (``registry.store.redis.RedisStore``).

    ``save`` assigns versions atomically: it stores ``record`` only if ``record.version`` is the
    successor of the newest version ever assigned to that registry (deleted ones included), and
    otherwise raises ``registry.errors.VersionConflict`` carrying the newest version. So two
    replicas racing on one registry never both get version N, and version numbers are never
    reused after a delete. Every method raises ``registry.errors.StoreUnavailable`` when the
    store cannot be reached.
    """

    def version(self, registry: str) -> int | None:
        """The registry's current version, or None when it does not exist (one cheap lookup)."""
        ...

    def versions(self) -> dict[str, int]:
        """Every registry's current version (one cheap lookup)."""
        ...

    def wait_for_change(self, timeout: float) -> bool:
        """Block until another writer announces a change (True) or ``timeout`` seconds pass."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


class Wipe(Protocol):
    """One time a shared store was found to have lost its data."""

    @property
    def at(self) -> float:
        """Unix time it was noticed."""
        ...


class Epoch(Protocol):
    """A shared store's data epoch: it changes when the store loses its data."""

    settle_ms: int  # how long a replica waits for another's write-back to settle

    @property
    def recoveries(self) -> Sequence[Wipe]:
        """The wipes this process recovered from, oldest first."""
        ...


@runtime_checkable
class WipeableStore(Protocol):
    """A store that can lose its data (Redis without persistence): its :class:`Epoch` notices,
    and the replicas write back what they hold (``registry.store.redis_epoch``)."""

    @property
    def epoch(self) -> Epoch: ...

    def set_republish_source(
        self,
        held: Callable[[], list[RegistryRecord]],
        after: Callable[[bool], None] | None = None,
        held_versions: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        """What this replica re-publishes after a wipe: ``held()`` its registry versions,
        then ``after(won)``; ``held_versions()`` lets a poll notice a store that went back."""
        ...


@runtime_checkable
class ReportsDamage(Protocol):
    """A store that can find a registry's newest version unreadable (the local directory)."""

    def damaged(self) -> dict[str, str]:
        """Registry -> the name of its unreadable newest version file (never a full path)."""
        ...
