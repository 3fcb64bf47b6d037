"""BM25 over tool text, with identifier-aware tokenisation (bm25s, Lucene variant).

score(q, d) = sum over query terms t of IDF(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
with k1 = 1.5, b = 0.75 and IDF(t) = ln(1 + (N - df + 0.5) / (df + 0.5)).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import bm25s
import numpy as np

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
STOPWORDS = frozenset(
    """a an and are as at be by can do does for from get has have how i in into is it its me my
    of on or please that the their them this to was what when where which who will with you your""".split()
)


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens; camelCase and snake_case identifiers are split, stopwords dropped."""
    tokens = []
    for word in _WORD.findall(_CAMEL.sub(" ", text)):
        word = word.lower()
        if word not in STOPWORDS:
            tokens.append(word)
    return tokens


class LexicalIndex:
    """BM25 index over one registry's tool texts."""

    def __init__(self, texts: Sequence[str]) -> None:
        self._n = len(texts)
        self._bm25 = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
        corpus = [tokenize(text) for text in texts]
        document_frequency: Counter[str] = Counter()
        for tokens in corpus:
            document_frequency.update(set(tokens))
        # Lucene's tf part tf / (tf + k1 * (...)) is below 1, so sum(idf) bounds a query's score.
        self._idf = {
            term: math.log(1.0 + (self._n - df + 0.5) / (df + 0.5))
            for term, df in document_frequency.items()
        }
        if self._n:
            self._bm25.index(corpus, show_progress=False)

    def __len__(self) -> int:
        return self._n

    def scores(self, query_tokens: Sequence[str]) -> np.ndarray:
        """BM25 score of every tool (0 for tools sharing no term with the query)."""
        if not self._n or not query_tokens:
            return np.zeros(self._n, dtype=np.float32)
        return np.asarray(self._bm25.get_scores(list(query_tokens)), dtype=np.float32)

    def ceiling(self, query_tokens: Sequence[str]) -> float:
        """Upper bound of any tool's score for this query: the sum of its terms' IDF."""
        return sum(self._idf.get(token, 0.0) for token in query_tokens)

    def search(self, query_tokens: Sequence[str], depth: int) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(ids, scores)`` of the ``depth`` best tools, best first (ties by position)."""
        return top_k(self.scores(query_tokens), depth)


def top_k(scores: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of the ``depth`` largest scores, descending, ties broken by index."""
    depth = min(depth, scores.shape[0])
    if depth <= 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    if depth < scores.shape[0]:
        part = np.argpartition(-scores, depth - 1)[:depth]
    else:
        part = np.arange(scores.shape[0])
    order = np.lexsort((part, -scores[part]))
    ids = part[order].astype(np.int64)
    return ids, scores[ids]
