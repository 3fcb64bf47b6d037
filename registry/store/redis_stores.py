"""The Redis backend: every store in one Redis shared by the replicas.

The registry store, the feedback log, the usage-memory store, the policy histories and the job
records share one connection; the remembered shortlists get a second one with a short timeout,
so a Redis that stops answering adds at most that to a query before the outage is noticed.
"""

from __future__ import annotations

from registry.settings import FeedbackArgs, StoreArgs
from registry.store.caller_key import RedisCallerKey, fixed_key
from registry.store.redis import (
    RedisFeedbackLog,
    RedisShortlistMemory,
    RedisStore,
    StoreHealth,
    connect,
)
from registry.store.redis_job_records import RedisJobRecords
from registry.store.redis_learning import RedisLearningStore
from registry.store.redis_policies import RedisPolicyStore
from registry.store.stores import Stores

__all__ = ["redis_stores"]


def redis_stores(store: StoreArgs, feedback: FeedbackArgs) -> Stores:
    """Every store on ``store.redis_url`` under ``store.redis_key_prefix()``."""
    if store.redis_url is None:
        raise ValueError("the Redis backend needs SHORTLIST_REDIS_URL")
    url = store.redis_url.get_secret_value()
    cluster = store.redis_cluster_mode()
    client = connect(url, cluster=cluster)
    health = StoreHealth()  # every Redis call reports to it
    prefix = store.redis_key_prefix()
    quick = connect(url, timeout=0.5, cluster=cluster)  # on the query path: fail fast
    return Stores(
        registries=RedisStore(client, prefix, health),
        shortlists=RedisShortlistMemory(quick, feedback.feedback_retention_seconds, prefix, health),
        feedback_log=RedisFeedbackLog(client, prefix, health),
        learning=RedisLearningStore(client, prefix),
        policies=RedisPolicyStore(client, prefix),
        job_records=RedisJobRecords(client, prefix),
        caller_key=fixed_key(store.caller_key) or RedisCallerKey(client, prefix + "caller-key"),
        health=health,
        log_reader=lambda: RedisFeedbackLog(client, prefix),
    )
