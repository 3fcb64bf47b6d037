"""Score tables: every query x every tool of a data set, under the base scorers.

:func:`score_table` reads a data set (:func:`registry.offline.datasets.load_dataset`), embeds
its tools and queries (when given an embedder) and scores them with BM25 as the service's
lexical index does; :class:`ScoreTable` holds the result and fuses it with
:func:`registry.index.hybrid.fuse`, the function serving uses. Caching a table and ranking it
into episodes is :mod:`registry.offline.tables`.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from registry.index.embed import Embedder
from registry.index.hybrid import HYBRID_ALPHA, SCORERS, fuse
from registry.index.lexical import LexicalIndex, tokenize
from registry.offline.datasets import LabelledQuery, load_dataset, needed_groups

__all__ = ["TABLE_FORMAT_VERSION", "ScoreTable", "score_table"]

TABLE_FORMAT_VERSION = 2  # 2: per-query needed groups (for "all found" with equivalents)


@dataclass
class ScoreTable:
    """Scores of every tool for every query of one data set, under the base scorers.

    ``dense`` is the MiniLM cosine (``None`` when built without an embedder), ``lexical`` the
    BM25 score and ``ceiling`` the query's BM25 bound (sum of its terms' IDF) used by the
    hybrid scorer. ``gold[i]`` / ``hits[i]`` are tool indices of query ``i``'s exact gold and
    of its equivalence-aware hit set (gold plus alternatives); ``needs[i]`` holds one index
    array per gold tool (the tool and its equivalents; ``None``: each gold tool alone).
    """

    name: str
    tool_names: list[str]
    query_ids: list[str]
    dense: np.ndarray | None
    lexical: np.ndarray
    ceiling: np.ndarray
    gold: list[np.ndarray]
    hits: list[np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)
    needs: list[list[np.ndarray]] | None = None

    def needed(self, i: int) -> list[np.ndarray]:
        """Query ``i``'s needed groups: one index array per gold tool."""
        if self.needs is None:
            return [np.array([g], dtype=np.int64) for g in self.gold[i]]
        return self.needs[i]

    @property
    def n_tools(self) -> int:
        return len(self.tool_names)

    @property
    def n_queries(self) -> int:
        return len(self.query_ids)

    def scores(self, scorer: str, alpha: float = HYBRID_ALPHA) -> np.ndarray:
        """``(Q, N)`` float32 scores under ``"dense"``, ``"bm25"`` or ``"hybrid"``.

        ``hybrid``: :func:`registry.index.hybrid.fuse` per query, as serving computes it.
        """
        if scorer not in SCORERS:
            raise ValueError(f"unknown scorer {scorer!r}; use one of {SCORERS}")
        if scorer == "bm25":
            return self.lexical
        if self.dense is None:
            raise ValueError(f"scorer {scorer!r} needs dense scores; build the table with an embedder")
        if scorer == "dense":
            return self.dense
        rows = [fuse(d, lx, float(c), alpha) for d, lx, c in zip(self.dense, self.lexical, self.ceiling)]
        return np.stack(rows) if rows else self.dense.astype(np.float32)

    def subset(self, rows: Sequence[int]) -> ScoreTable:
        """The table restricted to the queries ``rows`` (same registry)."""
        idx = np.asarray(rows, dtype=np.int64)
        return ScoreTable(
            name=self.name,
            tool_names=self.tool_names,
            query_ids=[self.query_ids[i] for i in idx],
            dense=None if self.dense is None else self.dense[idx],
            lexical=self.lexical[idx],
            ceiling=self.ceiling[idx],
            gold=[self.gold[i] for i in idx],
            hits=[self.hits[i] for i in idx],
            meta=dict(self.meta),
            needs=None if self.needs is None else [self.needs[i] for i in idx],
        )


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sample(queries: list[LabelledQuery], max_queries: int | None, seed: int) -> list[LabelledQuery]:
    if max_queries is not None and len(queries) > max_queries:
        return random.Random(seed).sample(queries, max_queries)
    return queries


def score_table(
    directory: Path | str,
    embedder: Embedder | None,
    *,
    max_queries: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> ScoreTable:
    """Score every query of a data directory against every tool.

    Args:
        directory: data directory (``tools.json`` + ``queries.jsonl``).
        embedder: query/tool embedder for the dense and hybrid scorers; ``None``: BM25 only.
        max_queries: sample this many queries (``random.Random(seed).sample``, the same sample
            ``shortlist episodes`` draws).
        seed: sampling seed.
        progress: show a tqdm bar while scoring.

    Returns:
        The table; holds ``2 * Q * N`` float32 (fine for benchmark sizes).
    """
    directory = Path(directory)
    data = load_dataset(directory)
    queries = _sample(data.queries, max_queries, seed)
    tools = data.tools
    by_name = {t.name: i for i, t in enumerate(tools)}
    lexical_index = LexicalIndex([t.text() for t in tools])
    dense = None
    if embedder is not None:
        tool_vecs = embedder.embed_documents([t.text() for t in tools])
        query_vecs = embedder.embed_documents([q.query for q in queries])
        dense = (query_vecs @ tool_vecs.T).astype(np.float32)
    lexical = np.zeros((len(queries), len(tools)), dtype=np.float32)
    ceiling = np.zeros(len(queries), dtype=np.float64)
    iterator: Iterable[tuple[int, LabelledQuery]] = enumerate(queries)
    if progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, total=len(queries), desc=f"bm25 {data.name}", unit="q")
    for i, q in iterator:
        tokens = tokenize(q.query)
        lexical[i] = lexical_index.scores(tokens)
        ceiling[i] = lexical_index.ceiling(tokens)
    gold, hits, needs = [], [], []
    for q in queries:
        g = sorted({by_name[name] for name in q.gold if name in by_name})
        alt = {by_name[name] for group in q.gold_alternatives for name in group if name in by_name}
        gold.append(np.asarray(g, dtype=np.int64))
        hits.append(np.asarray(sorted(set(g) | alt), dtype=np.int64))
        needs.append([
            np.asarray(sorted(by_name[name] for name in group if name in by_name), dtype=np.int64)
            for group in needed_groups(q)
        ])
    meta = {
        "dataset": data.name,
        "path": str(directory),
        "queries_sha256": _sha256_bytes((directory / "queries.jsonl").read_bytes()),
        "tools_sha256": _sha256_bytes((directory / "tools.json").read_bytes()),
        "n_tools": len(tools),
        "n_queries": len(queries),
        "max_queries": max_queries,
        "sample_seed": seed,
        "embedder": getattr(embedder, "model_id", None),
        "n_with_alternatives": int(sum(1 for q in queries if q.gold_alternatives)),
        "n_multi_gold": int(sum(1 for g in gold if g.size >= 2)),
    }
    return ScoreTable(
        name=data.name,
        tool_names=[t.name for t in tools],
        query_ids=[q.id for q in queries],
        dense=dense,
        lexical=lexical,
        ceiling=ceiling,
        gold=gold,
        hits=hits,
        meta=meta,
        needs=needs,
    )
