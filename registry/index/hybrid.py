"""Scorers over one registry snapshot: ``dense`` (MiniLM cosine), ``bm25`` and ``hybrid``.

``hybrid`` adds a small share of max-normalised BM25 to the cosine::

    hybrid(q, t) = cos(q, t) + alpha * bm25(q, t) / max_t' bm25(q, t')

so the score keeps the cosine scale the depth policy was trained on, and lexical evidence
(exact identifiers, rare words) breaks near-ties that MiniLM alone gets wrong. Plain
reciprocal-rank fusion throws the score margins away and loses found@1 on registries where
BM25 is weak (MetaTool); see README "Choosing the default scorer".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from registry.index.dense import DenseIndex
from registry.index.lexical import LexicalIndex, top_k

Scorer = Literal["dense", "bm25", "hybrid"]
SCORERS: tuple[str, ...] = ("dense", "bm25", "hybrid")
HYBRID_ALPHA = 0.2
# With an approximate (HNSW) dense index, fuse over the union of both candidate lists.
HYBRID_CANDIDATES = 200


@dataclass(frozen=True, slots=True)
class Query:
    """A query prepared once for every scorer: its embedding and its BM25 tokens."""

    vector: np.ndarray | None
    tokens: list[str]


def fuse(dense: np.ndarray, lexical: np.ndarray, alpha: float = HYBRID_ALPHA) -> np.ndarray:
    """Cosine plus ``alpha`` times BM25 scaled to [0, 1] by its maximum over the same tools."""
    peak = float(lexical.max()) if lexical.size else 0.0
    if peak <= 0.0:
        return dense.astype(np.float32, copy=False)
    return (dense + (alpha / peak) * lexical).astype(np.float32, copy=False)


def rank(
    scorer: str,
    query: Query,
    dense: DenseIndex,
    lexical: LexicalIndex,
    depth: int,
    alpha: float = HYBRID_ALPHA,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(ids, scores)`` of the ``depth`` best tools under ``scorer``, best first."""
    if scorer == "bm25":
        return lexical.search(query.tokens, depth)
    assert query.vector is not None, "dense and hybrid scorers need the query embedding"
    if scorer == "dense":
        return dense.search(query.vector, depth)
    lexical_all = lexical.scores(query.tokens)
    if dense.kind == "flat":
        cosine = dense.embeddings @ query.vector
        return top_k(fuse(cosine, lexical_all, alpha), depth)
    pool = max(depth, HYBRID_CANDIDATES)
    dense_ids, _ = dense.search(query.vector, pool)
    lexical_ids, _ = top_k(lexical_all, pool)
    ids = np.union1d(dense_ids, lexical_ids)
    peak = float(lexical_all.max()) if lexical_all.size else 0.0
    lexical_part = lexical_all[ids] * (alpha / peak) if peak > 0 else 0.0
    fused = dense.scores_for(query.vector, ids) + lexical_part
    order, scores = top_k(np.asarray(fused, dtype=np.float32), depth)
    return ids[order], scores
