"""The local directory store: durability, atomic versions, embedding cache."""

from __future__ import annotations

import numpy as np

from registry.store.base import RegistryRecord
from registry.store.local import LocalStore


def record(name: str, version: int, n: int = 2) -> RegistryRecord:
    return RegistryRecord(name, version, [{"name": f"t{i}", "v": version} for i in range(n)])


def test_save_load_roundtrip_survives_a_new_instance(tmp_path):
    LocalStore(tmp_path).save(record("a", 1))
    LocalStore(tmp_path).save(record("a", 2, n=3))
    reopened = LocalStore(tmp_path)
    loaded = reopened.load("a")
    assert loaded is not None
    assert loaded.version == 2 and len(loaded.tools) == 3
    assert reopened.list_registries() == ["a"]


def test_old_versions_are_pruned(tmp_path):
    store = LocalStore(tmp_path)
    for version in range(1, 6):
        store.save(record("a", version))
    files = sorted(p.name for p in (tmp_path / "registries" / "a").iterdir())
    assert files == ["v00000004.json", "v00000005.json"]


def test_leftover_temp_file_from_a_crash_is_ignored_and_removed(tmp_path):
    store = LocalStore(tmp_path)
    store.save(record("a", 1))
    torn = tmp_path / "registries" / "a" / ".tmp-v00000002.json-dead"
    torn.write_text('{"registry": "a", "version": 2, "tools": [')  # crash mid-write
    reopened = LocalStore(tmp_path)
    assert reopened.load("a").version == 1
    assert not torn.exists()


def test_damaged_newest_version_falls_back_to_the_previous_one(tmp_path):
    store = LocalStore(tmp_path)
    store.save(record("a", 1))
    store.save(record("a", 2))
    (tmp_path / "registries" / "a" / "v00000002.json").write_text("{not json")
    assert LocalStore(tmp_path).load("a").version == 1


def test_delete_is_durable(tmp_path):
    store = LocalStore(tmp_path)
    store.save(record("a", 1))
    store.save(record("b", 1))
    assert store.delete("a") is True
    assert store.delete("a") is False
    reopened = LocalStore(tmp_path)
    assert reopened.list_registries() == ["b"]
    assert reopened.load("a") is None


def test_embedding_cache_persists_and_cuts_a_torn_tail(tmp_path):
    store = LocalStore(tmp_path)
    vectors = {f"{i:064x}": np.full(4, i, dtype=np.float32) for i in range(3)}
    store.put_embeddings("model-x", vectors)
    store.put_embeddings("model-x", {"f" * 64: np.ones(4, dtype=np.float32)})
    path = next((tmp_path / "embeddings").iterdir())
    with open(path, "ab") as handle:
        handle.write(b"\x01" * 40)  # half a record, as a crash mid-append leaves it
    reopened = LocalStore(tmp_path)
    found = reopened.get_embeddings("model-x", [*vectors, "f" * 64, "e" * 64])
    assert set(found) == set(vectors) | {"f" * 64}
    assert np.array_equal(found[f"{2:064x}"], np.full(4, 2, dtype=np.float32))
    reopened.put_embeddings("model-x", {"e" * 64: np.zeros(4, dtype=np.float32)})
    assert "e" * 64 in LocalStore(tmp_path).get_embeddings("model-x", ["e" * 64])
    assert LocalStore(tmp_path).get_embeddings("other-model", list(vectors)) == {}
