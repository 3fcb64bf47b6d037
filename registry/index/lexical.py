"""BM25 over tool text, with identifier-aware tokenisation (Lucene variant), updatable in place.

score(q, d) = sum over query terms t of IDF(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
with k1 = 1.5, b = 0.75 and IDF(t) = ln(1 + (N - df + 0.5) / (df + 0.5)); a query term counts
as often as it occurs. The scores equal bm25s' ``method="lucene"`` (the library used before),
but are computed at query time from postings, so a one-tool change costs O(its terms) instead
of re-tokenising and re-scoring the whole registry (see :meth:`LexicalIndex.updated`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from registry.index.reuse import claim_previous_slots

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
STOPWORDS = frozenset(
    """a an and are as at be by can do does for from get has have how i in into is it its me my
    of on or please that the their them this to was what when where which who will with you your""".split()
)
K1 = 1.5
B = 0.75
# An updated index is compacted (slots renumbered, postings rebuilt from the kept term counts,
# nothing re-tokenised) once this share of its slots belongs to removed or changed tools.
MAX_DEAD_FRACTION = 0.2

_Postings = tuple[np.ndarray, np.ndarray]  # (slots int64, term frequencies float64)
_EMPTY_SLOTS = np.empty(0, dtype=np.int64)
_EMPTY_TF = np.empty(0, dtype=np.float64)


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens; camelCase and snake_case identifiers are split, stopwords dropped."""
    tokens = []
    for word in _WORD.findall(_CAMEL.sub(" ", text)):
        word = word.lower()
        if word not in STOPWORDS:
            tokens.append(word)
    return tokens


def _postings(docs: Sequence[Counter[str]], first_slot: int = 0) -> dict[str, _Postings]:
    slots: dict[str, list[int]] = {}
    freqs: dict[str, list[int]] = {}
    for slot, counts in enumerate(docs, start=first_slot):
        for term, tf in counts.items():
            slots.setdefault(term, []).append(slot)
            freqs.setdefault(term, []).append(tf)
    return {
        term: (np.array(slots[term], dtype=np.int64), np.array(freqs[term], dtype=np.float64))
        for term in slots
    }


class LexicalIndex:
    """BM25 index over one registry's tool texts. Never mutated once built.

    Documents live in *slots*; ``_slot_tool`` maps a slot to its tool position (-1: the slot of
    a removed or changed tool, skipped). A fresh index has slot i = tool i.
    """

    def __init__(self, texts: Sequence[str]) -> None:
        self._build([Counter(tokenize(text)) for text in texts])

    def _build(self, docs: list[Counter[str]]) -> None:
        postings = _postings(docs)
        lengths = np.array([sum(d.values()) for d in docs], dtype=np.float64)
        df = Counter({term: int(p[0].size) for term, p in postings.items()})
        self._assemble(docs, postings, np.arange(len(docs), dtype=np.int64), lengths, df)

    def _assemble(
        self,
        docs: list[Counter[str]],
        postings: dict[str, _Postings],
        slot_tool: np.ndarray,
        lengths: np.ndarray,
        df: Counter[str],
    ) -> None:
        self._docs = docs  # per slot: term counts (shared with derived indexes, read-only)
        self._postings = postings  # term -> slots holding it and its frequency there
        self._slot_tool = slot_tool
        self._lengths = lengths  # per slot: token count
        self._df = df  # live documents per term
        live = slot_tool >= 0
        self._n = int(live.sum())
        avgdl = float(lengths[live].sum()) / self._n if self._n else 1.0
        self._norm = K1 * (1.0 - B + B * lengths / (avgdl or 1.0))

    @classmethod
    def updated(
        cls, previous: LexicalIndex, texts: Sequence[str], reuse: np.ndarray
    ) -> LexicalIndex:
        """The index of a new version, derived from ``previous`` (left untouched).

        Args:
            previous: the index of the version this one replaces.
            texts: per new tool, its text (only those not reused are read).
            reuse: ``(n,)`` int, per new tool the position of a tool of ``previous`` with the
                same text, or -1 (that tool's text is tokenised and appended).

        Returns:
            A new index scoring exactly as ``LexicalIndex(texts)`` would; only the new texts
            are tokenised and only their terms' postings are copied.
        """
        n = len(texts)
        reuse = np.array(reuse, dtype=np.int64)
        if reuse.shape != (n,):
            raise ValueError("reuse must hold one entry per text")
        # A previous slot serves one new tool; a second tool with the same text gets its own.
        prev_tool_slot = claim_previous_slots(reuse, previous._slot_tool, previous._n)
        kept = reuse >= 0
        new_rows = np.flatnonzero(~kept).tolist()
        base = len(previous._docs)
        n_slots = base + len(new_rows)
        fresh = [Counter(tokenize(texts[row])) for row in new_rows]
        out = cls.__new__(cls)
        if n_slots - n > MAX_DEAD_FRACTION * n_slots:
            docs: list[Counter[str]] = []
            fresh_docs = iter(fresh)
            for r in reuse:
                docs.append(previous._docs[prev_tool_slot[r]] if r >= 0 else next(fresh_docs))
            out._build(docs)
            return out
        slot_tool = np.full(n_slots, -1, dtype=np.int64)
        slot_tool[prev_tool_slot[reuse[kept]]] = np.flatnonzero(kept)
        slot_tool[base:] = new_rows
        df = Counter(previous._df)
        newly_dead = np.flatnonzero((slot_tool[:base] < 0) & (previous._slot_tool >= 0))
        for slot in newly_dead:
            df.subtract(previous._docs[slot].keys())
        postings = dict(previous._postings)
        for term, (slots, freqs) in _postings(fresh, first_slot=base).items():
            df[term] += int(slots.size)
            old_slots, old_freqs = postings.get(term, (_EMPTY_SLOTS, _EMPTY_TF))
            postings[term] = (np.concatenate([old_slots, slots]), np.concatenate([old_freqs, freqs]))
        lengths = np.concatenate(
            [previous._lengths, np.array([sum(d.values()) for d in fresh], dtype=np.float64)]
        )
        out._assemble([*previous._docs, *fresh], postings, slot_tool, lengths, df)
        return out

    def __len__(self) -> int:
        return self._n

    @property
    def dead_slots(self) -> int:
        """Slots of removed or changed tools still in the postings (skipped when scoring)."""
        return int((self._slot_tool < 0).sum())

    def _idf(self, term: str) -> float:
        df = self._df.get(term, 0)
        if df <= 0:
            return 0.0
        return math.log(1.0 + (self._n - df + 0.5) / (df + 0.5))

    def scores(self, query_tokens: Sequence[str]) -> np.ndarray:
        """BM25 score of every tool (0 for tools sharing no term with the query).

        Same arithmetic as bm25s (per-posting score in float64 rounded to float32, summed in
        float32 term by term, in query order), so scores match it bit for bit.
        """
        scores = np.zeros(self._n, dtype=np.float32)
        if not self._n or not query_tokens:
            return scores
        parts: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}
        for term in query_tokens:
            if term not in parts:
                parts[term] = self._term_scores(term)
            found = parts[term]
            if found is not None:
                tools, part = found
                scores[tools] += part
        return scores

    def _term_scores(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        idf = self._idf(term)
        if idf <= 0.0:
            return None
        slots, freqs = self._postings[term]
        part = (float(np.float32(idf)) * (freqs / (self._norm[slots] + freqs))).astype(np.float32)
        tools = self._slot_tool[slots]
        alive = tools >= 0
        if alive.all():
            return tools, part
        return tools[alive], part[alive]

    def ceiling(self, query_tokens: Sequence[str]) -> float:
        """Upper bound of any tool's score for this query: the sum of its terms' IDF."""
        # Lucene's tf part tf / (tf + k1 * (...)) is below 1, so sum(idf) bounds a query's score.
        return sum(self._idf(token) for token in query_tokens)

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
