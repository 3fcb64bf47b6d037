"""Silent damage made loud: damaged newest versions, reused version numbers, damaged cached
vectors, and what a deleted registry leaves behind (through the real app, fake embedder)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from registry.errors import VersionConflict
from registry.store.base import RegistryRecord
from registry.store.local import LocalStore
from service.json_body import dumps

TOOLS = [
    {"name": "book_flight", "description": "Book a flight to a city"},
    {"name": "get_weather", "description": "Current weather conditions in a city"},
    {"name": "send_email", "description": "Send an email message"},
]


def record(version: int) -> RegistryRecord:
    return RegistryRecord("a", version, [{"name": "t", "v": version}])


def test_a_local_store_never_reuses_a_version_number(tmp_path):
    store = LocalStore(tmp_path)
    store.save(record(1))
    store.save(record(2))
    (tmp_path / "registries" / "a" / "v00000002.json").write_bytes(b'{"registry": "a", "vers')
    reopened = LocalStore(tmp_path)
    assert reopened.load("a").version == 1
    assert reopened.damaged() == {"a": "v00000002.json"}
    with pytest.raises(VersionConflict) as refused:
        reopened.save(record(2))  # what the engine asks for after serving v1
    assert refused.value.latest == 2
    reopened.save(record(3))
    assert reopened.load("a").version == 3 and reopened.damaged() == {}
    assert reopened.delete("a")
    with pytest.raises(VersionConflict):
        LocalStore(tmp_path).save(record(1))  # re-created after a delete: counting goes on
    LocalStore(tmp_path).save(record(4))


def test_a_damaged_newest_version_is_reported_and_its_number_skipped(make_client, settings):
    with make_client() as client:
        assert client.put("/registries/w", json=TOOLS).json()["version"] == 1
        assert client.put("/registries/w", json=TOOLS[:2]).json()["version"] == 2
    newest = settings.data_dir / "registries" / "w" / "v00000002.json"
    newest.write_bytes(newest.read_bytes()[:40])  # truncated
    with make_client() as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200
        warnings = ready.json()["warnings"]
        assert len(warnings) == 1 and "v00000002.json" in warnings[0] and "'w'" in warnings[0]
        assert str(settings.data_dir.resolve()) not in ready.text and "/registries/" not in ready.text
        assert "shortlist_registry_damaged_versions 1.0" in client.get("/metrics").text
        assert client.get("/registries/w").json()["version"] == 1
        written = client.put("/registries/w", json=TOOLS)
        assert written.status_code == 200 and written.json()["version"] == 3
        assert client.get("/readyz").json()["warnings"] == []
        assert "shortlist_registry_damaged_versions 0.0" in client.get("/metrics").text


def test_delete_then_recreate_keeps_counting_and_resets_the_learning_switch(make_client):
    with make_client() as client:
        client.put("/registries/w", json=TOOLS)
        client.put("/registries/w", json=TOOLS[:2])
        assert client.put("/registries/w/learning", json={"enabled": False}).json()["enabled"] is False
        assert client.delete("/registries/w").status_code == 204
        again = client.put("/registries/w", json=TOOLS[:1])
        assert again.status_code == 200 and again.json()["version"] == 3  # "version 1" is never said twice
        assert client.get("/registries/w/learning").json()["enabled"] is True
    with make_client() as client:  # after a restart too
        assert client.delete("/registries/w").status_code == 204
        assert client.put("/registries/w", json=TOOLS).json()["version"] == 4
        assert client.get("/registries/w/learning").json()["enabled"] is True


def _damage_embeddings(data_dir, value: float) -> None:
    """Overwrite every cached vector's floats with ``value`` (the 32-byte hashes kept)."""
    for path in (data_dir / "embeddings").glob("*.bin"):
        raw = bytearray(path.read_bytes())
        dim = int.from_bytes(raw[:4], "little")
        record = 32 + 4 * dim
        for start in range(4, len(raw), record):
            raw[start + 32 : start + record] = np.full(dim, value, np.float32).tobytes()
        path.write_bytes(bytes(raw))


@pytest.mark.parametrize("value", [float("nan"), 1e30])
def test_damaged_cached_vectors_are_refused_and_embedded_again(make_client, settings, value, caplog):
    with make_client() as client:
        client.put("/registries/w", json=TOOLS)
        before = client.post("/shortlist", json={"registry": "w", "query": "book a flight", "k": 3}).json()
    _damage_embeddings(settings.data_dir, value)
    with make_client() as client:
        assert "embedding cache" in caplog.text and "damaged" in caplog.text
        r = client.post("/shortlist", json={"registry": "w", "query": "book a flight", "k": 3})
        body = json.loads(r.text, parse_constant=lambda c: pytest.fail(f"literal {c} in the body"))
        assert [t["name"] for t in body["tools"]] == [t["name"] for t in before["tools"]]
        assert all(math.isfinite(t["score"]) and abs(t["score"]) < 10 for t in body["tools"])
    caplog.clear()
    with make_client() as client:  # the fresh vectors replaced the damaged records on disk
        client.post("/shortlist", json={"registry": "w", "query": "book a flight", "k": 3})
        assert "damaged" not in caplog.text


def test_hand_written_bodies_are_strict_json():
    assert dumps({"score": float("nan"), "s": [1.0, float("inf")]}) == '{"score":null,"s":[1.0,null]}'
    assert dumps({"a": 0.5}) == '{"a":0.5}'


@pytest.mark.e2e
def test_on_a_real_server_damaged_cached_vectors_are_embedded_again(server_factory, tmp_path):
    """A real server with the real MiniLM: NaN written over every cached vector between two
    starts is refused at load, embedded again, and the answers stay the undamaged ones."""
    import httpx

    data_dir = tmp_path / "real-data"
    query = {"registry": "w", "query": "book a flight", "k": 3}
    server = server_factory(data_dir=data_dir)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        assert client.put("/registries/w", json=TOOLS).status_code == 200
        before = [t["name"] for t in client.post("/shortlist", json=query).json()["tools"]]
    server.stop()
    assert list((data_dir / "embeddings").glob("*.bin")), "the real server cached no vectors"
    _damage_embeddings(data_dir, float("nan"))
    again = server_factory(data_dir=data_dir)
    with httpx.Client(base_url=again.url, timeout=60) as client:
        r = client.post("/shortlist", json=query)
        body = json.loads(r.text, parse_constant=lambda c: pytest.fail(f"literal {c} in the body"))
        assert [t["name"] for t in body["tools"]] == before
        assert all(math.isfinite(t["score"]) and abs(t["score"]) < 10 for t in body["tools"])
