"""Where the per-registry depth-policy histories live: one JSON document per registry, in the
data directory (here) or the shared Redis (:mod:`registry.store.redis_policies`).

A store keeps documents, not rules: :class:`registry.serving.stop_rules.PolicyBook` reads and
writes them as :class:`~registry.serving.stop_rules.PolicyHistory` values, so the store sits
below the query path and knows nothing of what a stop rule does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from registry.fsio import atomic_write_bytes, storage_errors
from registry.name_checks import validate_registry_name

__all__ = ["LocalPolicyStore", "PolicyStore"]


class PolicyStore(Protocol):
    """Where policy histories live; ``epoch`` changes whenever one is written or deleted."""

    def load(self, registry: str) -> dict[str, Any] | None:
        """The registry's history document, or None (no version was ever stored)."""
        ...

    def save(self, registry: str, doc: Mapping[str, Any]) -> None: ...

    def delete(self, registry: str) -> None: ...

    def registries(self) -> list[str]: ...

    def epoch(self) -> str: ...

    def lost(self) -> bool:
        """Whether the store lost its data (a flushed shared store; never a local one)."""
        ...

    def restore(self, docs: Mapping[str, Mapping[str, Any]]) -> int:
        """Write back documents a store that lost its data no longer holds, each only if absent
        (the first replica to write one back wins); returns how many this call wrote."""
        ...


class LocalPolicyStore:
    """One JSON file per registry under ``<data_dir>/policies/`` (atomic replace)."""

    def __init__(self, data_dir: Path | str) -> None:
        self.root = Path(data_dir) / "policies"
        self._lock = threading.Lock()
        self._epoch = 0

    def _path(self, registry: str) -> Path:
        return self.root / f"{validate_registry_name(registry)}.json"

    def load(self, registry: str) -> dict[str, Any] | None:
        try:
            doc: dict[str, Any] = json.loads(self._path(registry).read_text("utf-8"))
        except FileNotFoundError:
            return None
        return doc

    def save(self, registry: str, doc: Mapping[str, Any]) -> None:
        path = self._path(registry)
        raw = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        with self._lock, storage_errors("saving a registry's depth policies"):
            self.root.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, raw)  # whole or absent; no temporary left on failure
            self._epoch += 1

    def delete(self, registry: str) -> None:
        with self._lock, storage_errors("deleting a registry's depth policies"):
            self._path(registry).unlink(missing_ok=True)
            self._epoch += 1

    def registries(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.json"))

    def epoch(self) -> str:
        return str(self._epoch)

    def lost(self) -> bool:
        return False  # files are not flushed away: a deleted one was deleted on purpose

    def restore(self, docs: Mapping[str, Mapping[str, Any]]) -> int:
        return 0
