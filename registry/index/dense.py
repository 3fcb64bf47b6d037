"""FAISS inner-product index over L2-normalised embeddings (cosine similarity)."""

from __future__ import annotations

import faiss
import numpy as np

HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 128


class DenseIndex:
    """Exact search below ``hnsw_min_tools`` vectors, HNSW (M=32) at or above it."""

    def __init__(self, embeddings: np.ndarray, *, hnsw_min_tools: int) -> None:
        self.embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        n, dim = self.embeddings.shape
        self.kind = "hnsw" if n >= hnsw_min_tools else "flat"
        if self.kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            index.hnsw.efSearch = HNSW_EF_SEARCH
        else:
            index = faiss.IndexFlatIP(dim)
        if n:
            index.add(self.embeddings)
        self._index = index

    def __len__(self) -> int:
        return int(self.embeddings.shape[0])

    def search(self, query: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(ids, scores)`` of the ``depth`` nearest tools, best first."""
        depth = min(depth, len(self))
        if depth <= 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        if self.kind == "hnsw":
            self._index.hnsw.efSearch = max(HNSW_EF_SEARCH, depth)
        scores, ids = self._index.search(query.reshape(1, -1).astype(np.float32, copy=False), depth)
        keep = ids[0] >= 0
        return ids[0][keep].astype(np.int64), scores[0][keep]

    def scores_for(self, query: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Exact cosine of the query with the given tools."""
        return self.embeddings[ids] @ query.astype(np.float32, copy=False)
