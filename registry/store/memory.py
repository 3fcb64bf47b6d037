"""In-process store: nothing survives the process. For evaluation runs and unit tests."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from registry.store.base import RegistryRecord


class MemoryStore:
    """A ``Store`` kept in dictionaries."""

    def __init__(self) -> None:
        self._records: dict[str, RegistryRecord] = {}
        self._embeddings: dict[str, dict[str, np.ndarray]] = {}
        self._lock = threading.Lock()

    def list_registries(self) -> list[str]:
        return sorted(self._records)

    def load(self, registry: str) -> RegistryRecord | None:
        return self._records.get(registry)

    def save(self, record: RegistryRecord) -> None:
        with self._lock:
            self._records[record.registry] = copy.deepcopy(record)

    def delete(self, registry: str) -> bool:
        with self._lock:
            return self._records.pop(registry, None) is not None

    def get_embeddings(self, model_id: str, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        table = self._embeddings.get(model_id, {})
        return {h: table[h] for h in hashes if h in table}

    def put_embeddings(self, model_id: str, vectors: Mapping[str, np.ndarray]) -> None:
        with self._lock:
            self._embeddings.setdefault(model_id, {}).update(vectors)
