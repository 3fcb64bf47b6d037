"""The storage interface. The local directory store is the embedded default; Redis comes later."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class RegistryRecord:
    """One durable registry version: the tool definitions exactly as uploaded."""

    registry: str
    version: int
    tools: list[dict[str, Any]]
    equivalents: list[list[str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "registry": self.registry,
            "version": self.version,
            "tools": self.tools,
            "equivalents": self.equivalents,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RegistryRecord:
        return cls(
            registry=str(data["registry"]),
            version=int(data["version"]),
            tools=list(data["tools"]),
            equivalents=[list(group) for group in data.get("equivalents", [])],
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
