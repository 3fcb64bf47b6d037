"""Where learned state lives: next to the registries, locally (here) or in the shared Redis
(:mod:`registry.store.redis_learning`).

Two things per registry:

* the usage-memory state, one blob (``UsageMemory.state_bytes``): written by every replica now
  and then (they fold the same events, so the blobs agree up to the order events arrived in);
* its control record ``{"enabled": bool, "wiped_at": epoch seconds, "profile_weight": float,
  "profile_fit": {...}, "similarity": float | null, "similarity_fit": {...}, "companions": [...],
  "companions_fit": {...}}``: small, read by every replica on each sync tick, so a switch-off, a
  wipe or a newly fitted profile weight, memory neighbourhood or set of learned companions
  reaches all of them.

Local layout: ``<data_dir>/learning/<registry>.usage.npz`` and ``<data_dir>/learning/control.json``.
Redis: ``<prefix>usage:<registry>`` (string) and ``<prefix>learning:control`` (hash registry -> JSON).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from registry.fsio import atomic_write_bytes, storage_errors

__all__ = ["Control", "LearningStore", "LocalLearningStore"]


@dataclass(frozen=True, slots=True)
class Control:
    """A registry's learning switch and the time of its last wipe (0: never)."""

    enabled: bool = True
    wiped_at: float = 0.0
    profile_weight: float = 0.0  # the usage profiles' fitted fusion weight (a refit sets it)
    profile_fit: dict[str, Any] | None = None  # how that weight was chosen
    similarity: float | None = None  # the usage memory's fitted neighbourhood (None: the setting)
    similarity_fit: dict[str, Any] | None = None  # how it was chosen
    companions: tuple[dict[str, Any], ...] = ()  # the learned companion edges a refit shipped
    companions_fit: dict[str, Any] | None = None  # how they were chosen

    def to_json(self) -> str:
        return json.dumps({"enabled": self.enabled, "wiped_at": self.wiped_at,
                           "profile_weight": self.profile_weight, "profile_fit": self.profile_fit,
                           "similarity": self.similarity, "similarity_fit": self.similarity_fit,
                           "companions": list(self.companions), "companions_fit": self.companions_fit})

    @classmethod
    def from_json(cls, raw: bytes | str) -> Control:
        doc = json.loads(raw)
        fit, sim_fit, sim = doc.get("profile_fit"), doc.get("similarity_fit"), doc.get("similarity")
        return cls(
            enabled=bool(doc.get("enabled", True)),
            wiped_at=float(doc.get("wiped_at", 0.0)),
            profile_weight=float(doc.get("profile_weight", 0.0)),
            profile_fit=fit if isinstance(fit, dict) else None,
            similarity=float(sim) if isinstance(sim, (int, float)) else None,
            similarity_fit=sim_fit if isinstance(sim_fit, dict) else None,
            companions=tuple(e for e in doc.get("companions") or () if isinstance(e, dict)),
            companions_fit=doc.get("companions_fit") if isinstance(doc.get("companions_fit"), dict) else None,
        )


class LearningStore(Protocol):
    def load_state(self, registry: str) -> bytes | None: ...

    def save_state(self, registry: str, raw: bytes) -> None: ...

    def delete_state(self, registry: str) -> None: ...

    def controls(self) -> dict[str, Control]: ...

    def set_control(self, registry: str, control: Control) -> None: ...


class LocalLearningStore:
    """Files under ``<data_dir>/learning`` (one process per data directory)."""

    def __init__(self, data_dir: Path | str) -> None:
        self.root = Path(data_dir) / "learning"
        self._lock = threading.Lock()

    def _state_path(self, registry: str) -> Path:
        return self.root / f"{registry}.usage.npz"

    def load_state(self, registry: str) -> bytes | None:
        try:
            return self._state_path(registry).read_bytes()
        except FileNotFoundError:
            return None

    def save_state(self, registry: str, raw: bytes) -> None:
        with storage_errors("saving what a registry learned"):
            self.root.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self._state_path(registry), raw)

    def delete_state(self, registry: str) -> None:
        with storage_errors("deleting what a registry learned"):
            self._state_path(registry).unlink(missing_ok=True)

    def controls(self) -> dict[str, Control]:
        try:
            doc: dict[str, Any] = json.loads((self.root / "control.json").read_text("utf-8"))
        except FileNotFoundError:
            return {}
        return {name: Control.from_json(json.dumps(value)) for name, value in doc.items()}

    def set_control(self, registry: str, control: Control) -> None:
        with self._lock:
            controls = self.controls()
            controls[registry] = control
            with storage_errors("saving the learning switches"):
                self.root.mkdir(parents=True, exist_ok=True)
            doc = {name: json.loads(c.to_json()) for name, c in sorted(controls.items())}
            with storage_errors("saving the learning switches"):
                atomic_write_bytes(self.root / "control.json", json.dumps(doc).encode("utf-8"))
