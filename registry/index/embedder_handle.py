"""The embedder of a running core: built by the assembly, loaded by start-up.

Loading MiniLM takes seconds (and may export it first), so a core is assembled with a handle
and its start-up (on the loader thread, while a face answers health checks) calls
:meth:`EmbedderHandle.load`. Everything that embeds (the query runner, the writer, the usage
learner) holds the handle from construction on, so nothing is wired after loading.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from registry.errors import NotReady
from registry.index.embed import Embedder, FloatArray
from registry.index.query_cache import CachedEmbedder

__all__ = ["EmbedderHandle"]


class EmbedderHandle:
    """An :class:`~registry.index.embed.Embedder` once :meth:`load` has run.

    Args:
        factory: builds the embedder (called once, by :meth:`load`).
        cache_size: queries kept by the query-embedding cache (0: no cache).
    """

    def __init__(self, factory: Callable[[], Embedder], cache_size: int = 0) -> None:
        self._factory = factory
        self._cache_size = cache_size
        self._embedder: Embedder | None = None
        self._lock = threading.Lock()
        self.query_cache: CachedEmbedder | None = None  # set by load() when the cache is on

    def load(self) -> Embedder:
        """Build the embedder (behind the query cache when it is on); later calls return it."""
        with self._lock:
            if self._embedder is None:
                embedder = self._factory()
                if self._cache_size > 0:
                    embedder = self.query_cache = CachedEmbedder(embedder, self._cache_size)
                self._embedder = embedder
            return self._embedder

    @property
    def loaded(self) -> Embedder:
        """The embedder (raises :class:`NotReady` before :meth:`load`)."""
        embedder = self._embedder
        if embedder is None:
            raise NotReady("service not ready: the embedder is still loading")
        return embedder

    @property
    def model_id(self) -> str:
        return self.loaded.model_id

    @property
    def dim(self) -> int:
        return self.loaded.dim

    def embed_query(self, text: str) -> FloatArray:
        return self.loaded.embed_query(text)

    def embed_documents(self, texts: Sequence[str], batch_size: int = 32) -> FloatArray:
        return self.loaded.embed_documents(texts, batch_size)

    def __repr__(self) -> str:
        return f"EmbedderHandle({self._embedder!r})"
