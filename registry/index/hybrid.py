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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from registry.index.dense import DenseIndex
from registry.index.lexical import LexicalIndex, top_k

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


def score_ids(
    scorer: str,
    query: Query,
    dense: DenseIndex,
    lexical: LexicalIndex,
    ids: np.ndarray,
    alpha: float = HYBRID_ALPHA,
) -> np.ndarray:
    """The scores :func:`rank` gives the tools ``ids`` (any of them, ranked deep or not)."""
    ids = np.asarray(ids, dtype=np.int64)
    if scorer == "bm25":
        return lexical.scores(query.tokens)[ids].astype(np.float32, copy=False)
    assert query.vector is not None, "dense and hybrid scorers need the query embedding"
    cosine = dense.scores_for(query.vector, ids)
    if scorer == "dense":
        return cosine.astype(np.float32, copy=False)
    lexical_all = lexical.scores(query.tokens)
    return fuse(cosine, lexical_all[ids], lexical.ceiling(query.tokens), alpha)


def best_scores(
    scorer: str,
    windows: Sequence[Query],
    dense: DenseIndex,
    lexical: LexicalIndex,
    ids: np.ndarray,
    alpha: float = HYBRID_ALPHA,
) -> np.ndarray:
    """Each tool's best score over the windows of a long query (see :func:`rank_windows`)."""
    scores = [score_ids(scorer, w, dense, lexical, ids, alpha) for w in windows]
    return np.max(np.stack(scores), axis=0) if len(scores) > 1 else scores[0]


def rank_windows(
    scorer: str,
    windows: Sequence[Query],
    dense: DenseIndex,
    lexical: LexicalIndex,
    depth: int,
    alpha: float = HYBRID_ALPHA,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rank` for a long query read as windows: a tool scores its best window.

    Each window is a query of its own (embedding and BM25 terms), so a request stated in one
    paragraph of a long message is not drowned by the words repeated around it.
    """
    if len(windows) == 1:
        return rank(scorer, windows[0], dense, lexical, depth, alpha)
    if dense.kind == "flat" or scorer == "bm25":
        candidates = np.arange(len(dense), dtype=np.int64)
    else:
        pool = max(depth, HYBRID_CANDIDATES)
        candidates = np.unique(
            np.concatenate([rank(scorer, w, dense, lexical, pool, alpha)[0] for w in windows])
        )
    order, scores = top_k(best_scores(scorer, windows, dense, lexical, candidates, alpha), depth)
    return candidates[order], scores


def rank_within(
    scorer: str,
    windows: Sequence[Query],
    dense: DenseIndex,
    lexical: LexicalIndex,
    ids: np.ndarray,
    depth: int,
    alpha: float = HYBRID_ALPHA,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rank_windows` over the tools ``ids`` alone (ascending positions): a scoped request
    (:mod:`registry.serving.scope`). Each of them is scored exactly, so no other tool can take a
    place in the ranking, and ties break by position as in the whole registry's ranking."""
    order, scores = top_k(best_scores(scorer, windows, dense, lexical, ids, alpha), depth)
    return ids[order], scores
