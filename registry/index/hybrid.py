"""Scorers over one registry snapshot: ``dense`` (MiniLM cosine), ``bm25`` and ``hybrid``.

``hybrid`` adds query-calibrated BM25 to the cosine::

    hybrid(q, t) = cos(q, t) + alpha * bm25(q, t) / sum_{w in q} idf(w)

The denominator bounds any tool's BM25 score for this query, so the lexical part is the share
of the query's term weight the tool matches: an absolute level, unlike normalising by the
best tool's score (which hands the top tool +alpha whether its match is strong or weak and
blurs the score gaps the depth policy reads). Lexical evidence (identifiers, rare words)
breaks near-ties that MiniLM alone gets wrong. Plain reciprocal-rank fusion throws the score
margins away and loses found@1 on registries where BM25 is weak (MetaTool); see README
"Choosing the default scorer".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from registry.index.dense import DenseIndex
from registry.index.lexical import LexicalIndex, top_k

Scorer = Literal["dense", "bm25", "hybrid"]
SCORERS: tuple[str, ...] = ("dense", "bm25", "hybrid")
HYBRID_ALPHA = 0.8
# With an approximate (HNSW) dense index, fuse over the union of both candidate lists.
HYBRID_CANDIDATES = 200


@dataclass(frozen=True, slots=True)
class Query:
    """A query prepared once for every scorer: its embedding and its BM25 tokens."""

    vector: np.ndarray | None
    tokens: list[str]


def fuse(
    dense: np.ndarray, lexical: np.ndarray, ceiling: float, alpha: float = HYBRID_ALPHA
) -> np.ndarray:
    """Cosine plus ``alpha`` times BM25 divided by the query's score ceiling."""
    if ceiling <= 0.0:
        return dense.astype(np.float32, copy=False)
    return (dense + (alpha / ceiling) * lexical).astype(np.float32, copy=False)


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
    ceiling = lexical.ceiling(query.tokens)
    if dense.kind == "flat":
        cosine = dense.embeddings @ query.vector
        return top_k(fuse(cosine, lexical_all, ceiling, alpha), depth)
    pool = max(depth, HYBRID_CANDIDATES)
    dense_ids, _ = dense.search(query.vector, pool)
    lexical_ids, _ = top_k(lexical_all, pool)
    ids = np.union1d(dense_ids, lexical_ids)
    fused = fuse(dense.scores_for(query.vector, ids), lexical_all[ids], ceiling, alpha)
    order, scores = top_k(fused, depth)
    return ids[order], scores
