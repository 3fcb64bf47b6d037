"""The depth-policy histories in the shared Redis (see :mod:`registry.store.policies`).

``<prefix>policies:<registry>`` (JSON) and a ``<prefix>policies-epoch`` counter every replica
polls (one GET per sync interval) to hot-swap the active rules.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from registry.errors import StoreUnavailable

__all__ = ["RedisPolicyStore"]


class _Guarded:
    """A Redis client whose errors surface as :class:`StoreUnavailable` (a 503, not a 500)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)  # a proxy: every client method, wrapped
        if not callable(attr) or name == "pipeline":
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except Exception as exc:
                if type(exc).__module__.startswith("redis"):  # redis.cluster's errors too
                    raise StoreUnavailable(f"policy store unavailable: {exc}") from exc
                raise

        return call


def _dump(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"))


class RedisPolicyStore:
    """A :class:`~registry.store.policies.PolicyStore` in Redis (``client`` from
    :func:`registry.store.redis.connect`)."""

    def __init__(self, client: Any, prefix: str) -> None:
        self._client = _Guarded(client)
        self._key = f"{prefix}policies:"
        self._epoch_key = f"{prefix}policies-epoch"

    def load(self, registry: str) -> dict[str, Any] | None:
        raw = self._client.get(self._key + registry)
        return None if raw is None else dict(json.loads(raw))

    def save(self, registry: str, doc: Mapping[str, Any]) -> None:
        pipe = self._client.pipeline(transaction=True)
        pipe.set(self._key + registry, _dump(doc))
        pipe.incr(self._epoch_key)
        pipe.execute()

    def delete(self, registry: str) -> None:
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(self._key + registry)
        pipe.incr(self._epoch_key)
        pipe.execute()

    def registries(self) -> list[str]:
        names = (k.decode() if isinstance(k, bytes) else str(k) for k in self._client.scan_iter(self._key + "*"))
        return sorted(n[len(self._key) :] for n in names)

    def epoch(self) -> str:
        raw = self._client.get(self._epoch_key)
        return "0" if raw is None else (raw.decode() if isinstance(raw, bytes) else str(raw))

    def lost(self) -> bool:
        """Whether the store lost its data (its epoch counter, set by every save, is gone)."""
        return not self._client.exists(self._epoch_key)

    def restore(self, docs: Mapping[str, Mapping[str, Any]]) -> int:
        written = 0
        for registry, doc in docs.items():
            written += bool(self._client.set(self._key + registry, _dump(doc), nx=True))
        self._client.incr(self._epoch_key)
        return written
