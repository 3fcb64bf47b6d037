"""The one assembly: the store backend is chosen by name, and every part comes from it."""

from __future__ import annotations

import pytest

from registry.assembly import STORE_BACKENDS, assemble, store_backend
from registry.errors import ValidationFailed
from registry.store.local import LocalStore
from registry.store.local_stores import local_stores
from registry.store.redis_stores import redis_stores
from tests.cores import hashing_factory, shipped_policy


def test_the_backend_is_chosen_by_name_and_an_unknown_one_is_refused_naming_the_known(settings):
    assert set(STORE_BACKENDS) == {"local", "redis"}
    assert store_backend(settings) is local_stores
    assert store_backend(settings.model_copy(update={"redis_url": "redis://nowhere:1/0"})) is redis_stores
    with pytest.raises(ValidationFailed) as caught:
        store_backend(settings.model_copy(update={"store_backend": "memory"}))
    assert "'memory'" in caught.value.message and "local, redis" in caught.value.message


def test_a_named_local_backend_wins_over_a_redis_url_and_every_part_shares_its_stores(settings):
    named = settings.model_copy(update={"store_backend": "local", "redis_url": "redis://nowhere:1/0"})
    parts = assemble(named, embedder_factory=hashing_factory, bor_policy=shipped_policy())
    assert isinstance(parts.stores.registries, LocalStore) and parts.sync is None  # no Redis contacted
    assert parts.writer.store is parts.stores.registries and parts.recorder.log is parts.stores.feedback_log
    assert parts.writer.snapshots is parts.snapshots and parts.policies.book.store is parts.stores.policies
    assert parts.learner.store is parts.stores.learning
