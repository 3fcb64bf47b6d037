"""The learning store in the shared Redis: ``<prefix>usage:<registry>`` (the usage-memory blob)
and ``<prefix>learning:control`` (hash registry -> control JSON); see :mod:`registry.store.learning`."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from registry.store.learning import Control
from registry.store.redis_base import unreachable_is_unavailable

__all__ = ["RedisLearningStore"]


class RedisLearningStore:
    """Keys in the shared Redis (``client`` from ``registry.store.redis.connect``).

    Raises:
        StoreUnavailable: from every method, when Redis cannot be reached.
    """

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.control_key = f"{prefix}learning:control"

    def _state_key(self, registry: str) -> str:
        return f"{self.prefix}usage:{registry}"

    def _call(self, what: str) -> AbstractContextManager[None]:
        return unreachable_is_unavailable("learning store", what)

    def load_state(self, registry: str) -> bytes | None:
        with self._call("load a usage memory"):
            raw = self.client.get(self._state_key(registry))
        return None if raw is None else bytes(raw)

    def save_state(self, registry: str, raw: bytes) -> None:
        with self._call("save a usage memory"):
            self.client.set(self._state_key(registry), raw)

    def delete_state(self, registry: str) -> None:
        with self._call("delete a usage memory"):
            self.client.delete(self._state_key(registry))

    def controls(self) -> dict[str, Control]:
        with self._call("read the learning controls"):
            raw = self.client.hgetall(self.control_key) or {}
        return {
            (k.decode() if isinstance(k, bytes) else str(k)): Control.from_json(v) for k, v in raw.items()
        }

    def set_control(self, registry: str, control: Control) -> None:
        with self._call("write a learning control"):
            self.client.hset(self.control_key, registry, control.to_json())
