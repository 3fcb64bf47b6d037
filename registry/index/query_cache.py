"""A bounded LRU cache of query embeddings in front of an :class:`Embedder`.

Agents repeat themselves: the same user message is sent at several steps of one task, and a
multi-step request embeds each of its intents, which recur across requests ("email it to the
team"). A query embedding costs ~6 ms of CPU (MiniLM fp32, one core); a cache hit costs a dict
lookup. Keys are the embedder's ``model_id`` and the text with its whitespace normalised (the
MiniLM tokenizer splits on whitespace, so such texts embed identically); values are the
read-only vectors. Documents (tool texts) are never cached here: they have their own
content-hash cache in the store.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from registry.index.embed import Embedder, FloatArray

__all__ = ["CachedEmbedder", "QueryCacheStats"]


@dataclass(frozen=True, slots=True)
class QueryCacheStats:
    hits: int
    misses: int
    entries: int
    capacity: int


class CachedEmbedder:
    """Wraps ``embedder``; :meth:`embed_query` answers repeated texts from an LRU cache.

    Args:
        embedder: the embedder to wrap (its ``model_id`` and ``dim`` are kept).
        capacity: most cached queries (>= 1); the least recently used goes first.
    """

    def __init__(self, embedder: Embedder, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.inner = embedder
        self.model_id = embedder.model_id
        self.dim = embedder.dim
        self.capacity = int(capacity)
        self._entries: OrderedDict[tuple[str, str], FloatArray] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    def __repr__(self) -> str:
        return f"CachedEmbedder({self.inner!r}, capacity={self.capacity})"

    def embed_query(self, text: str) -> FloatArray:
        """The query's embedding, from the cache when the same text was embedded before."""
        key = (self.model_id, " ".join(text.split()))
        with self._lock:
            vector = self._entries.get(key)
            if vector is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return vector
            self._misses += 1
        vector = np.asarray(self.inner.embed_query(text))
        vector.setflags(write=False)  # shared by every caller that hits it
        with self._lock:
            self._entries[key] = vector
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return vector

    def embed_documents(self, texts: Sequence[str], batch_size: int = 32) -> FloatArray:
        """Passed through: tool texts are cached by content hash in the store instead."""
        return self.inner.embed_documents(texts, batch_size=batch_size)

    def stats(self) -> QueryCacheStats:
        with self._lock:
            return QueryCacheStats(self._hits, self._misses, len(self._entries), self.capacity)
