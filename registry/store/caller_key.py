"""The secret that keys caller hashes (who sent a query or feedback, for the learning loop).

Caller hashes are shown to query-token holders (``caller_shares`` in a registry's learning
report) and written to the feedback log. An unkeyed hash of a bearer token can be brute-forced
offline when the token is weak, so every caller hash is an HMAC under this key: the setting
``SHORTLIST_CALLER_KEY`` when given, else a random key made once and kept where the replicas'
state is (``<data_dir>/caller.key``, mode 0600, or one Redis key set only if absent), so every
replica and every restart hashes a token the same way.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from registry.fsio import atomic_write_bytes

__all__ = ["KEY_BYTES", "FixedKey", "RedisCallerKey", "fixed_key", "local_caller_key"]

KEY_BYTES = 32
KEY_FILE = "caller.key"

log = logging.getLogger(__name__)


class FixedKey:
    """A caller key that never changes."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def __call__(self) -> bytes:
        return self._key


def fixed_key(setting: SecretStr | None) -> FixedKey | None:
    """The key ``SHORTLIST_CALLER_KEY`` fixes, or None: the backend keeps one (either backend)."""
    return FixedKey(setting.get_secret_value().encode("utf-8")) if setting is not None else None


def local_caller_key(data_dir: Path) -> bytes:
    """The key kept in ``data_dir`` (made on first use). A data dir that cannot be written gets
    a key for this process only (logged once): hashes then change at the next start, which
    resets per-caller decay and rate windows, nothing else."""
    path = Path(data_dir) / KEY_FILE
    try:
        key = path.read_bytes()
        if len(key) == KEY_BYTES:
            return key
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("caller key %s unreadable (%s): caller hashes last until restart", KEY_FILE, exc)
        return secrets.token_bytes(KEY_BYTES)
    key = secrets.token_bytes(KEY_BYTES)
    try:
        os.makedirs(data_dir, exist_ok=True)
        atomic_write_bytes(path, key, mode=0o600)
    except OSError as exc:
        log.warning("cannot keep the caller key in the data dir (%s): caller hashes last until restart", exc)
    return key


class RedisCallerKey:
    """The key kept in Redis under ``name`` (set only if absent, so replicas agree on the first).

    Read on first use, not at construction: a replica may start while Redis is down. Until Redis
    answers, a key for this process stands in; nothing keyed by it outlives the outage, since
    remembered shortlists and feedback live in that same Redis.
    """

    def __init__(self, client: Any, name: str) -> None:
        self._client = client
        self._name = name
        self._key: bytes | None = None
        self._stand_in = secrets.token_bytes(KEY_BYTES)

    def __call__(self) -> bytes:
        if self._key is None:
            try:
                self._client.set(self._name, secrets.token_bytes(KEY_BYTES), nx=True)
                key = self._client.get(self._name)
            except Exception:  # any Redis failure: the stand-in, retried next call
                return self._stand_in
            self._key = bytes(key) if key else self._stand_in
        return self._key
