"""Base-embedder vectors and BM25 scores of a corpus, computed once and cached on disk.

The adapter sweep and the LOSO benchmark rank every source many times; the expensive parts
(MiniLM over ~11k tool texts and ~9k queries, BM25 over every query x tool) never change
between runs, so each source's are kept in ``<cache_dir>/<source>-<key>.npz``, keyed by the
embedder's ``model_id``, the tool texts and the queries (any change recomputes).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from registry.index.embed import Embedder
from registry.index.hybrid import HYBRID_ALPHA
from registry.index.lexical import LexicalIndex, tokenize
from registry.offline.corpus import tool_texts
from registry.offline.datasets import Dataset


@dataclass(frozen=True, slots=True)
class SourceVectors:
    """One source, ready to rank: base embeddings, BM25 matrix and gold positions."""

    name: str
    tools: np.ndarray  # (n_tools, dim) float32, unit rows
    queries: np.ndarray  # (n_queries, dim) float32, unit rows
    bm25: np.ndarray  # (n_queries, n_tools) float32: BM25 / the query's ceiling, in [0, 1]
    gold: tuple[tuple[int, ...], ...]  # per query, the tool rows it needs

    @property
    def multi_tool(self) -> np.ndarray:
        return np.array([len(g) > 1 for g in self.gold])

    def hybrid(self, alpha: float = HYBRID_ALPHA) -> np.ndarray:
        """The hybrid scorer's (n_queries, n_tools) scores: cosine + ``alpha`` * the lexical term."""
        return self.queries @ self.tools.T + alpha * self.bm25


def _key(data: Dataset, model_id: str) -> str:
    h = hashlib.sha256(model_id.encode())
    for text in tool_texts(data.tools):
        h.update(text.encode("utf-8", "replace") + b"\x00")
    for q in data.queries:
        h.update(f"{q.id}\x01{q.query}\x01{','.join(q.gold)}\x00".encode("utf-8", "replace"))
    return h.hexdigest()[:16]


def bm25_matrix(texts: Sequence[str], queries: Sequence[str]) -> np.ndarray:
    """BM25 of every query x tool, divided by the query's ceiling (the hybrid's lexical term)."""
    index = LexicalIndex(list(texts))
    out = np.zeros((len(queries), len(texts)), dtype=np.float32)
    for i, query in enumerate(queries):
        tokens = tokenize(query)
        ceiling = index.ceiling(tokens)
        if ceiling > 0:
            out[i] = index.scores(tokens) / ceiling
    return out


def source_vectors(
    data: Dataset,
    embedder: Embedder,
    cache_dir: Path | None,
    log: Callable[[str], None] = lambda _: None,
) -> SourceVectors:
    """Embed and BM25-score one source, or read them from ``cache_dir``."""
    row = {tool.name: i for i, tool in enumerate(data.tools)}
    gold = tuple(tuple(row[g] for g in q.gold) for q in data.queries)
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{data.name}-{_key(data, embedder.model_id)}.npz"
        if path.is_file():
            with np.load(path) as z:
                return SourceVectors(data.name, z["tools"], z["queries"], z["bm25"], gold)
    start = time.monotonic()
    texts = tool_texts(data.tools)
    queries = [q.query for q in data.queries]
    tools = embedder.embed_documents(texts, batch_size=16)
    query_vectors = embedder.embed_documents(queries, batch_size=32)
    bm25 = bm25_matrix(texts, queries)
    log(f"{data.name}: {len(texts)} tools, {len(queries)} queries in {time.monotonic() - start:.0f}s")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, tools=tools, queries=query_vectors, bm25=bm25)
        tmp.replace(path)
    return SourceVectors(data.name, tools, query_vectors, bm25, gold)


def corpus_vectors(
    corpus: Sequence[Dataset],
    embedder: Embedder,
    cache_dir: Path | None,
    log: Callable[[str], None] = lambda _: None,
) -> list[SourceVectors]:
    """:func:`source_vectors` of every source, smallest first (a partial run leaves the most)."""
    order = sorted(range(len(corpus)), key=lambda i: len(corpus[i].tools) + len(corpus[i].queries))
    done = {i: source_vectors(corpus[i], embedder, cache_dir, log) for i in order}
    return [done[i] for i in range(len(corpus))]
