"""Scorers over one registry snapshot: ``dense`` (MiniLM cosine), ``bm25`` and ``hybrid``.

Each scorer is a class that names itself (:class:`Scorer`); :data:`SCORERS` maps the names a
request may ask for to them, in the order the API lists them. ``hybrid`` adds query-calibrated
BM25 to the cosine::

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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from registry.index.dense import DenseIndex
from registry.index.lexical import LexicalIndex, tokenize, top_k

__all__ = [
    "HYBRID_ALPHA",
    "SCORERS",
    "Bm25Scorer",
    "DenseScorer",
    "HybridScorer",
    "Query",
    "Scorer",
    "best_scores",
    "fuse",
    "rank_windows",
    "rank_within",
]

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


class Scorer(Protocol):
    """Ranks a snapshot's tools for a prepared :class:`Query`; ``name`` is what requests call it."""

    name: ClassVar[str]
    reads_vector: ClassVar[bool]  # needs the query's embedding (the embedder runs)
    reads_tokens: ClassVar[bool]  # needs the query's BM25 tokens
    # scores every tool exactly in one pass, whatever the dense index (no candidate pool needed)
    scores_every_tool: ClassVar[bool]

    def rank(self, query: Query, dense: DenseIndex, lexical: LexicalIndex, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, scores)`` of the ``depth`` best tools, best first."""
        ...

    def score_ids(self, query: Query, dense: DenseIndex, lexical: LexicalIndex, ids: np.ndarray) -> np.ndarray:
        """The scores :meth:`rank` gives the tools ``ids`` (any of them, ranked deep or not)."""
        ...

    def tuned(self, alpha: float) -> Scorer:
        """This scorer with lexical weight ``alpha`` (one without a lexical part is unchanged)."""
        ...


def prepare(scorer: Scorer, text: str, embed: Callable[[str], np.ndarray]) -> Query:
    """``text`` as ``scorer`` reads it: embedded and tokenised only when the scorer needs each."""
    return Query(
        vector=embed(text) if scorer.reads_vector else None,
        tokens=tokenize(text) if scorer.reads_tokens else [],
    )


@dataclass(frozen=True, slots=True)
class DenseScorer:
    """MiniLM cosine between the query and each tool's text."""

    name: ClassVar[str] = "dense"
    reads_vector: ClassVar[bool] = True
    reads_tokens: ClassVar[bool] = False
    scores_every_tool: ClassVar[bool] = False

    def rank(self, query: Query, dense: DenseIndex, lexical: LexicalIndex, depth: int) -> tuple[np.ndarray, np.ndarray]:
        assert query.vector is not None, "the dense scorer needs the query embedding"
        return dense.search(query.vector, depth)

    def score_ids(self, query: Query, dense: DenseIndex, lexical: LexicalIndex, ids: np.ndarray) -> np.ndarray:
        assert query.vector is not None, "the dense scorer needs the query embedding"
        return dense.scores_for(query.vector, ids).astype(np.float32, copy=False)

    def tuned(self, alpha: float) -> Scorer:
        return self


@dataclass(frozen=True, slots=True)
class Bm25Scorer:
    """BM25 over the tools' names and descriptions (:mod:`registry.index.lexical`)."""

    name: ClassVar[str] = "bm25"
    reads_vector: ClassVar[bool] = False
    reads_tokens: ClassVar[bool] = True
    scores_every_tool: ClassVar[bool] = True

    def rank(self, query: Query, dense: DenseIndex, lexical: LexicalIndex, depth: int) -> tuple[np.ndarray, np.ndarray]:
        return lexical.search(query.tokens, depth)

    def score_ids(self, query: Query, dense: DenseIndex, lexical: LexicalIndex, ids: np.ndarray) -> np.ndarray:
        return lexical.scores(query.tokens)[ids].astype(np.float32, copy=False)

    def tuned(self, alpha: float) -> Scorer:
        return self


@dataclass(frozen=True, slots=True)
class HybridScorer:
    """Cosine plus ``alpha`` times the query-calibrated BM25 (:func:`fuse`; the module docstring)."""

    name: ClassVar[str] = "hybrid"
    reads_vector: ClassVar[bool] = True
    reads_tokens: ClassVar[bool] = True
    scores_every_tool: ClassVar[bool] = False
    alpha: float = HYBRID_ALPHA

    def rank(self, query: Query, dense: DenseIndex, lexical: LexicalIndex, depth: int) -> tuple[np.ndarray, np.ndarray]:
        assert query.vector is not None, "the hybrid scorer needs the query embedding"
        lexical_all = lexical.scores(query.tokens)
        ceiling = lexical.ceiling(query.tokens)
        if dense.kind == "flat":
            cosine = dense.embeddings @ query.vector
            return top_k(fuse(cosine, lexical_all, ceiling, self.alpha), depth)
        pool = max(depth, HYBRID_CANDIDATES)
        dense_ids, _ = dense.search(query.vector, pool)
        lexical_ids, _ = top_k(lexical_all, pool)
        ids = np.union1d(dense_ids, lexical_ids)
        fused = fuse(dense.scores_for(query.vector, ids), lexical_all[ids], ceiling, self.alpha)
        order, scores = top_k(fused, depth)
        return ids[order], scores

    def score_ids(self, query: Query, dense: DenseIndex, lexical: LexicalIndex, ids: np.ndarray) -> np.ndarray:
        assert query.vector is not None, "the hybrid scorer needs the query embedding"
        cosine = dense.scores_for(query.vector, ids)
        return fuse(cosine, lexical.scores(query.tokens)[ids], lexical.ceiling(query.tokens), self.alpha)

    def tuned(self, alpha: float) -> Scorer:
        return HybridScorer(alpha)


SCORERS: Mapping[str, Scorer] = {s.name: s for s in (DenseScorer(), Bm25Scorer(), HybridScorer())}
"""Every scorer by the name a request gives (the API lists them in this order)."""


def best_scores(scorer: Scorer, windows: Sequence[Query], dense: DenseIndex, lexical: LexicalIndex, ids: np.ndarray) -> np.ndarray:
    """Each tool's best score over the windows of a long query (see :func:`rank_windows`)."""
    ids = np.asarray(ids, dtype=np.int64)
    scores = [scorer.score_ids(w, dense, lexical, ids) for w in windows]
    return np.max(np.stack(scores), axis=0) if len(scores) > 1 else scores[0]


def rank_windows(
    scorer: Scorer, windows: Sequence[Query], dense: DenseIndex, lexical: LexicalIndex, depth: int
) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`Scorer.rank` for a long query read as windows: a tool scores its best window.

    Each window is a query of its own (embedding and BM25 terms), so a request stated in one
    paragraph of a long message is not drowned by the words repeated around it.
    """
    if len(windows) == 1:
        return scorer.rank(windows[0], dense, lexical, depth)
    if dense.kind == "flat" or scorer.scores_every_tool:
        candidates = np.arange(len(dense), dtype=np.int64)
    else:
        pool = max(depth, HYBRID_CANDIDATES)
        candidates = np.unique(np.concatenate([scorer.rank(w, dense, lexical, pool)[0] for w in windows]))
    order, scores = top_k(best_scores(scorer, windows, dense, lexical, candidates), depth)
    return candidates[order], scores


def rank_within(
    scorer: Scorer, windows: Sequence[Query], dense: DenseIndex, lexical: LexicalIndex, ids: np.ndarray, depth: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rank_windows` over the tools ``ids`` alone (ascending positions): a scoped request
    (:mod:`registry.serving.scope`). Each of them is scored exactly, so no other tool can take a
    place in the ranking, and ties break by position as in the whole registry's ranking."""
    order, scores = top_k(best_scores(scorer, windows, dense, lexical, ids), depth)
    return ids[order], scores
