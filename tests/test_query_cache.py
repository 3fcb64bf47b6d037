"""The query-embedding LRU cache: bounded, keyed by model and normalised text, counted."""

from __future__ import annotations

import numpy as np
import pytest

from registry.index.embed import HashingEmbedder
from registry.index.query_cache import CachedEmbedder


class CountingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(dim=16)
        self.calls = 0

    def embed_query(self, text: str) -> np.ndarray:
        self.calls += 1
        return super().embed_query(text)


def test_repeated_queries_hit_and_give_the_same_vector():
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, capacity=10)
    first = cached.embed_query("send the report to Bob")
    again = cached.embed_query("  send the report\tto Bob ")  # same words, other whitespace
    assert inner.calls == 1
    assert np.array_equal(first, again) and np.array_equal(first, inner.embed_query("send the report to Bob"))
    assert not again.flags.writeable  # shared: nobody may change it
    other = cached.embed_query("Send the report to Bob")  # case is kept in the key
    assert inner.calls == 3 and other.shape == (16,)
    stats = cached.stats()
    assert (stats.hits, stats.misses, stats.entries, stats.capacity) == (1, 2, 2, 10)
    assert (cached.model_id, cached.dim) == (inner.model_id, inner.dim)


def test_the_cache_is_bounded_and_evicts_the_least_recently_used():
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, capacity=2)
    cached.embed_query("a one")
    cached.embed_query("b two")
    cached.embed_query("a one")  # a is now the most recent
    cached.embed_query("c three")  # evicts b
    assert cached.stats().entries == 2
    calls = inner.calls
    cached.embed_query("a one")
    assert inner.calls == calls
    cached.embed_query("b two")
    assert inner.calls == calls + 1
    with pytest.raises(ValueError):
        CachedEmbedder(inner, capacity=0)


def test_documents_pass_through():
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, capacity=4)
    out = cached.embed_documents(["x y", "z w"])
    assert out.shape == (2, 16) and cached.stats().entries == 0


def test_service_counts_cache_lookups_in_metrics(make_client, tools_payload):
    with make_client() as client:
        client.put("/registries/r", json=tools_payload)
        for _ in range(3):
            assert client.post("/shortlist", json={"registry": "r", "query": "weather in Oslo"}).status_code == 200
        text = client.get("/metrics").text
    hits = [line for line in text.splitlines() if line.startswith('shortlist_query_embedding_cache_lookups_total{result="hit"}')]
    assert hits and float(hits[0].split()[-1]) >= 2
    assert "shortlist_query_embedding_cache_entries" in text
    with make_client(query_cache_size=0) as client:
        client.put("/registries/r", json=tools_payload)
        client.post("/shortlist", json={"registry": "r", "query": "weather in Oslo"})
        assert "shortlist_query_embedding_cache" not in client.get("/metrics").text
