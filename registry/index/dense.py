"""Inner-product search over L2-normalised embeddings (cosine): exact (numpy) or FAISS HNSW."""

from __future__ import annotations

import faiss
import numpy as np

from registry.index.lexical import top_k
from registry.index.reuse import claim_previous_slots

HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 128
# An updated HNSW index is rebuilt from scratch once this share of its slots is dead.
MAX_DEAD_FRACTION = 0.2


class DenseIndex:
    """Exact search (one matrix-vector product) below ``hnsw_min_tools`` vectors, FAISS HNSW
    (M=32) at or above it.

    Rows of ``embeddings`` are tool positions; :meth:`search` returns tool positions. An HNSW
    index can be derived from the previous version's (:meth:`updated`): the graph is cloned,
    vectors of new or changed tools are added, and the slots of removed or changed ones are
    masked out of every search, so a one-tool change costs milliseconds instead of a rebuild.

    Args:
        embeddings: ``(n, dim)`` float32, L2-normalised.
        hnsw_min_tools: use HNSW at or above this many vectors.
    """

    def __init__(self, embeddings: np.ndarray, *, hnsw_min_tools: int) -> None:
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        n, dim = embeddings.shape
        kind = "hnsw" if n >= hnsw_min_tools else "flat"
        index: faiss.Index | None = None
        if kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            index.hnsw.efSearch = HNSW_EF_SEARCH
            if n:
                index.add(embeddings)
        # Exact search is a matrix-vector product over ``embeddings`` itself: no FAISS copy to
        # fill, so a new version of a flat index costs nothing beyond its matrix.
        self._assemble(embeddings, kind, index, np.arange(n, dtype=np.int64))

    def _assemble(
        self, embeddings: np.ndarray, kind: str, index: faiss.Index | None, slot_tool: np.ndarray
    ) -> None:
        self.embeddings = embeddings
        self.kind = kind
        self._index = index
        # slot (vector id in the FAISS index) -> tool position, -1 for a dead slot
        self._slot_tool = slot_tool
        self._live_bits: np.ndarray | None = None  # kept alive: the selector points into it
        self._selector: faiss.IDSelector | None = None
        if (slot_tool < 0).any():
            self._live_bits = np.packbits(slot_tool >= 0, bitorder="little")
            self._selector = faiss.IDSelectorBitmap(slot_tool.size, faiss.swig_ptr(self._live_bits))

    @classmethod
    def updated(
        cls, previous: DenseIndex, embeddings: np.ndarray, reuse: np.ndarray, *, hnsw_min_tools: int
    ) -> DenseIndex:
        """The index of a new version, derived from ``previous`` when that is cheaper.

        Args:
            previous: the index of the version this one replaces (left untouched: readers may
                still be searching it).
            embeddings: ``(n, dim)`` rows of the new version's tools.
            reuse: ``(n,)`` int, for each new tool the position of a tool of ``previous`` with
                the same embedding (same content), or -1.
            hnsw_min_tools: as for the constructor.

        Returns:
            A new index. Derived (clone + add + mask) when both versions use HNSW and at most
            ``MAX_DEAD_FRACTION`` of the slots would be dead; otherwise built from scratch.
        """
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        n = embeddings.shape[0]
        reuse = np.array(reuse, dtype=np.int64)  # a copy: duplicates are cleared below
        if previous.kind != "hnsw" or n < hnsw_min_tools or reuse.shape != (n,):
            return cls(embeddings, hnsw_min_tools=hnsw_min_tools)
        assert previous._index is not None  # an HNSW index always has its graph
        # A previous slot serves one new tool; a second tool with the same vector gets its own.
        prev_tool_slot = claim_previous_slots(reuse, previous._slot_tool, len(previous))
        kept = reuse >= 0
        new_rows = np.flatnonzero(~kept)
        n_slots = previous._index.ntotal + new_rows.size
        if n_slots - n > MAX_DEAD_FRACTION * n_slots:
            return cls(embeddings, hnsw_min_tools=hnsw_min_tools)
        slot_tool = np.full(n_slots, -1, dtype=np.int64)
        slot_tool[prev_tool_slot[reuse[kept]]] = np.flatnonzero(kept)
        slot_tool[previous._index.ntotal :] = new_rows
        index = faiss.clone_index(previous._index)
        if new_rows.size:
            index.add(embeddings[new_rows])
        out = cls.__new__(cls)  # the graph is already built: skip __init__
        out._assemble(embeddings, "hnsw", index, slot_tool)
        return out

    def __len__(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def dead_slots(self) -> int:
        """Slots of removed or changed tools still in the graph (masked out of searches)."""
        return int((self._slot_tool < 0).sum())

    def search(self, query: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(ids, scores)`` of the ``depth`` nearest tools, best first."""
        depth = min(depth, len(self))
        if depth <= 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        if self._index is None:
            return top_k(self.embeddings @ query.astype(np.float32, copy=False), depth)
        q = query.reshape(1, -1).astype(np.float32, copy=False)
        # missing from the stubs faiss ships, present at runtime
        params = faiss.SearchParametersHNSW(  # type: ignore[attr-defined]
            efSearch=max(HNSW_EF_SEARCH, depth)
        )
        if self._selector is not None:
            params.sel = self._selector
        scores, slots = self._index.search(q, depth, params=params)
        keep = slots[0] >= 0
        tools = self._slot_tool[slots[0][keep]]
        alive = tools >= 0
        return tools[alive], scores[0][keep][alive]

    def scores_for(self, query: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Exact cosine of the query with the given tools."""
        return self.embeddings[ids] @ query.astype(np.float32, copy=False)
