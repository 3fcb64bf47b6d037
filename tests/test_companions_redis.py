"""Learned companions across two replicas sharing a real Redis (fake embedder): feedback on one
and a refit there, the companion appears in the other's shortlists and graph; a Redis that loses
its data gets the shipped companions written back, so a replica started afterwards serves them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import SecretStr

from registry.core import Shortlister
from tests.cores import new_core
from tests.redis_server import RedisServer
from tests.test_companions import PAIR, names, teach
from tests.test_graph import REST
from tests.test_learning_redis import eventually

KNOBS = {"learning_save_interval_seconds": 0.2, "sync_interval_seconds": 0.2, "explore_share": 0.0}


@pytest.fixture
def own_redis(tmp_path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    yield server
    server.stop()


def replica(settings, bor_policy, url: str, prefix: str, tmp) -> Shortlister:
    s = settings.model_copy(update={"redis_url": SecretStr(url), "redis_prefix": prefix, "data_dir": tmp, **KNOBS})
    return new_core(s, bor_policy=bor_policy)


def companion(c: Shortlister) -> tuple[str, str | None] | None:
    return next(((n, why) for n, why in names(c) if why and why.startswith("learned companion")), None)


def test_a_companion_learned_on_one_replica_is_served_by_the_other_and_survives_a_wipe(
    settings, bor_policy, own_redis, redis_prefix, tmp_path
):
    a = replica(settings, bor_policy, own_redis.url, redis_prefix, tmp_path / "a")
    b = replica(settings, bor_policy, own_redis.url, redis_prefix, tmp_path / "b")
    try:
        a.put_registry("shop", REST)
        eventually(lambda: b.ready and b.snapshots.has_registry("shop"))
        assert companion(a) is None and companion(b) is None
        teach(a)
        eventually(lambda: b.learning_report("shop")["companion_pairs"] == a.learning_report("shop")["companion_pairs"] > 0)
        assert companion(b) is None  # counted on both, shipped by neither yet
        job = a.policies.refit("shop")
        assert job.estimate["profile"]["companions"]["shipped"] >= 1, job.estimate
        served = companion(a)
        assert served is not None and served[0] == PAIR[1]
        eventually(lambda: companion(b) == served)  # the control record reached b
        learned = {(e["first"], e["then"]) for e in b.graph("shop")["learned"]}
        assert PAIR in learned
        a.store.client.flushall()  # Redis loses everything: the replicas write it back
        eventually(lambda: a.store.client.hexists(f"{redis_prefix}learning:control", "shop"), timeout=20)
        c = replica(settings, bor_policy, own_redis.url, redis_prefix, tmp_path / "c")
        try:
            eventually(lambda: c.ready and c.snapshots.has_registry("shop"), timeout=20)
            eventually(lambda: companion(c) == served)
        finally:
            c.close()
        b.wipe_learning("shop")  # the learning switch's reset reaches every replica
        eventually(lambda: companion(a) is None)
    finally:
        a.close()
        b.close()
