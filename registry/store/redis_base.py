"""Redis plumbing shared by the store, the shortlist memory and the feedback stream: the client,
the outage flag, and the mapping of connection errors to :class:`~registry.errors.StoreUnavailable`."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from registry.errors import StoreUnavailable

log = logging.getLogger(__name__)

# Redis replies that mean "the server cannot serve writes right now", not a bug of ours.
_UNAVAILABLE_REPLIES = ("LOADING", "READONLY", "MASTERDOWN", "MISCONF", "OOM", "NOREPLICAS")


def connect(url: str, *, timeout: float = 5.0, cluster: bool = False) -> Any:
    """A client for ``url`` that fails fast when Redis is down.

    redis-py's default retries for about ten seconds; during an outage that would stall every
    write. One quick retry absorbs a dropped idle connection, nothing more. ``cluster`` (or a
    ``redis+cluster://`` URL): a :class:`redis.cluster.RedisCluster` from one node's address;
    it follows MOVED replies and refreshes its slot map, so a failover costs a few retries
    (up to 8, about a second apart at most) instead of failing the first call after it.
    """
    scheme, sep, rest = url.partition("://")
    if scheme.endswith("+cluster"):
        url, cluster = scheme.removesuffix("+cluster") + sep + rest, True
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(
            url,
            socket_connect_timeout=min(timeout, 2.0),
            socket_timeout=timeout,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 8),
            health_check_interval=30,
        )
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=min(timeout, 2.0),
        socket_timeout=timeout,
        retry=Retry(ExponentialBackoff(cap=0.1, base=0.02), 1),
        health_check_interval=30,
    )


def is_cluster(client: Any) -> bool:
    """``client`` talks to a Redis Cluster (its pipelines cannot load scripts)."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


class StoreHealth:
    """Whether the last Redis call succeeded; shared by the store, the memory and the log.

    Request threads read :attr:`up` to skip best-effort Redis calls during an outage; the
    sync thread's successful poll sets it back.
    """

    def __init__(self) -> None:
        self.up = True
        self._last_warning = 0.0

    def failed(self, what: str, exc: BaseException) -> None:
        if self.up or time.monotonic() - self._last_warning > 30:
            log.warning("redis unavailable (%s): %s: %s", what, type(exc).__name__, exc)
            self._last_warning = time.monotonic()
        self.up = False

    def succeeded(self) -> None:
        if not self.up:
            log.info("redis is reachable again")
        self.up = True


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return True
    if isinstance(exc, redis.exceptions.ResponseError):
        return str(exc).split(" ", 1)[0].upper() in _UNAVAILABLE_REPLIES
    return isinstance(exc, OSError)


@contextmanager
def unreachable_is_unavailable(store: str, what: str, hint: str = "") -> Iterator[None]:
    """A Redis that cannot be reached (connection, timeout, socket) as :class:`StoreUnavailable`
    naming ``store`` and ``what`` (a 503): for the stores without an outage flag of their own."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise StoreUnavailable(
            f"the {store} (Redis) is unavailable: cannot {what}{hint}", {"store": "redis", "operation": what}
        ) from exc


class RedisBase:
    def __init__(self, client: redis.Redis, prefix: str, health: StoreHealth | None) -> None:
        self.client = client
        self.prefix = prefix
        self.health = health or StoreHealth()

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    @contextmanager
    def _call(self, what: str, message: str) -> Iterator[None]:
        try:
            yield
        except redis.exceptions.RedisError as exc:
            if not is_unavailable(exc):
                raise
            self.health.failed(what, exc)
            raise StoreUnavailable(message, {"store": "redis", "operation": what}) from exc
        except OSError as exc:
            self.health.failed(what, exc)
            raise StoreUnavailable(message, {"store": "redis", "operation": what}) from exc
        self.health.succeeded()


STORE_DOWN = "the registry store (Redis) is unavailable; queries are still answered, retry writes later"
FEEDBACK_DOWN = "the feedback store (Redis) is unavailable; feedback is not recorded, retry later"
