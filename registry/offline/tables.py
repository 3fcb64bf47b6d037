"""Score tables cached and ranked into episodes: the offline pipeline's first two steps.

No HTTP, no torch::

    table = load_or_build_table(data_dir, embedder)  # every query x every tool, base scorers
    ranked = rank_table(table, "hybrid")              # episodes: top scores + gold ranks

The table itself (:class:`~registry.offline.score_tables.ScoreTable`, built by
:func:`~registry.offline.score_tables.score_table`) is in :mod:`registry.offline.score_tables`.
**Candidate sets** (the paper's protocol): :func:`candidate_episodes` builds, per query, a set
of ``N`` tools = the gold tools + the highest-scoring non-gold tools ("hard distractors") +
random fill from the rest of the registry, and ranks only those; ``P_rand`` is then computed
against ``N``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from registry.index.embed import Embedder
from registry.index.hybrid import HYBRID_ALPHA
from registry.offline.episodes import Episode
from registry.offline.score_tables import TABLE_FORMAT_VERSION, ScoreTable, score_table
from registry.serving.features import FEATURE_WINDOW

__all__ = ["RankedSet", "candidate_episodes", "load_or_build_table", "rank_table"]


# ----------------------------------------------------------------------------- cached tables


def _table_key(directory: Path, embedder: Embedder | None, max_queries: int | None, seed: int) -> str:
    h = hashlib.sha256()
    for part in (
        hashlib.sha256((directory / "tools.json").read_bytes()).hexdigest(),
        hashlib.sha256((directory / "queries.jsonl").read_bytes()).hexdigest(),
        str(getattr(embedder, "model_id", None)),
        str(max_queries),
        str(seed),
        str(TABLE_FORMAT_VERSION),
    ):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _concat_ragged(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lens = np.array([a.size for a in arrays], dtype=np.int64)
    flat = np.concatenate(list(arrays)) if arrays else np.zeros(0, np.int64)
    return flat.astype(np.int64), np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)


def _split_ragged(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    return [flat[offsets[i] : offsets[i + 1]] for i in range(offsets.size - 1)]


def load_or_build_table(
    directory: Path | str,
    embedder: Embedder | None,
    *,
    cache_dir: Path | None = None,
    max_queries: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> ScoreTable:
    """:func:`score_table`, cached as ``<cache_dir>/<name>-<key>.npz`` when ``cache_dir`` is set.

    The key hashes the tools, the queries, the embedder's model id, the sample size and seed,
    so a changed input never reuses a stale table.
    """
    directory = Path(directory)
    if cache_dir is None:
        return score_table(directory, embedder, max_queries=max_queries, seed=seed, progress=progress)
    path = Path(cache_dir) / f"{directory.name}-{_table_key(directory, embedder, max_queries, seed)}.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as z:
            gold = _split_ragged(z["gold"], z["gold_offsets"])
            hits = _split_ragged(z["hits"], z["hits_offsets"])
            groups = _split_ragged(z["needs"], z["needs_offsets"])
            needs = [groups[a:b] for a, b in zip(z["needs_query"][:-1], z["needs_query"][1:])]
            return ScoreTable(
                name=str(z["name"]),
                tool_names=[str(s) for s in z["tool_names"]],
                query_ids=[str(s) for s in z["query_ids"]],
                dense=z["dense"] if bool(z["has_dense"]) else None,
                lexical=z["lexical"],
                ceiling=z["ceiling"],
                gold=gold,
                hits=hits,
                meta=json.loads(str(z["meta_json"])),
                needs=needs,
            )
    table = score_table(directory, embedder, max_queries=max_queries, seed=seed, progress=progress)
    gold_flat, gold_off = _concat_ragged(table.gold)
    hits_flat, hits_off = _concat_ragged(table.hits)
    needed = [table.needed(i) for i in range(table.n_queries)]
    needs_flat, needs_off = _concat_ragged([a for per_query in needed for a in per_query])
    needs_query = np.concatenate([[0], np.cumsum([len(g) for g in needed])]).astype(np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(
        tmp,
        name=np.array(table.name),
        tool_names=np.array(table.tool_names, dtype=np.str_),
        query_ids=np.array(table.query_ids, dtype=np.str_),
        has_dense=np.array(table.dense is not None),
        dense=table.dense if table.dense is not None else np.zeros((0, 0), np.float32),
        lexical=table.lexical,
        ceiling=table.ceiling,
        gold=gold_flat,
        gold_offsets=gold_off,
        hits=hits_flat,
        hits_offsets=hits_off,
        needs=needs_flat,
        needs_offsets=needs_off,
        needs_query=needs_query,
        meta_json=np.array(json.dumps(table.meta, sort_keys=True)),
    )
    tmp.replace(path)
    return table


# ----------------------------------------------------------------------------- rankings


@dataclass
class RankedSet:
    """One data set ranked under one scorer: exact and equivalence-aware episodes.

    All lists hold the same score lists; they differ only in which tools count as hits.
    ``all_equiv`` is for "all found" counting equivalents: its ``gold_ranks`` hold, per gold
    tool, the best rank of the tool or an equivalent (so every one shown = all ranks ``< K``).
    ``None`` (built by hand): a single-gold episode takes its best equivalence-aware rank, a
    multi-gold one its exact ranks (equivalents cannot be attributed to a gold tool).
    """

    name: str
    scorer: str
    exact: list[Episode]
    equiv: list[Episode]
    meta: dict[str, Any] = field(default_factory=dict)
    all_equiv: list[Episode] | None = None

    def needed_equiv(self) -> list[Episode]:
        """The episodes for equivalence-aware "all found" (``all_equiv`` or its fallback)."""
        if self.all_equiv is not None:
            return self.all_equiv
        out = []
        for ex, eq in zip(self.exact, self.equiv):
            if ex.n_gold <= 1 and eq.n_gold:
                ex = Episode(ex.scores, eq.gold_ranks[:1], ex.n_tools, ex.query_id)
            out.append(ex)
        return out

    @property
    def n_tools_label(self) -> str:
        sizes = sorted({e.n_tools for e in self.exact})
        return str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"


def _order(scores: np.ndarray, tool_index: np.ndarray | None = None) -> np.ndarray:
    """Descending order, ties broken by registry tool index (as :func:`registry.index.lexical.top_k`)."""
    key = np.arange(scores.size) if tool_index is None else tool_index
    return np.lexsort((key, -scores))


def _episodes(
    scores: np.ndarray,
    hit_sets: Sequence[np.ndarray],
    needs: Sequence[np.ndarray],
    depth: int,
    query_id: str,
    tool_index: np.ndarray | None = None,
) -> list[Episode]:
    """One ranking, one episode per hit set, plus the needed-groups episode (last)."""
    # Ties go by registry index, never by position in a candidate list (which puts the gold
    # first and would hand it every tie, e.g. all the zero BM25 scores).
    order = _order(scores, tool_index)
    position = np.empty(scores.size, dtype=np.int64)
    position[order] = np.arange(scores.size)
    top = scores[order[:depth]]
    ranks = [np.sort(position[h]) for h in hit_sets]
    ranks.append(np.sort([int(position[g].min()) for g in needs if g.size]).astype(np.int64))
    return [Episode(scores=top, gold_ranks=r, n_tools=scores.size, query_id=query_id) for r in ranks]


def rank_table(
    table: ScoreTable,
    scorer: str,
    *,
    depth: int = 60,
    alpha: float = HYBRID_ALPHA,
    rows: Sequence[int] | None = None,
) -> RankedSet:
    """Rank a table's queries over the full registry (top ``depth`` scores kept per query).

    ``depth`` must cover the largest evaluated cap plus the feature lookahead; the default 60
    covers caps up to 50 and the :data:`~registry.serving.features.FEATURE_WINDOW` of 51.
    """
    depth = max(depth, FEATURE_WINDOW)
    all_scores = table.scores(scorer, alpha)
    idx = range(table.n_queries) if rows is None else rows
    exact, equiv, all_equiv = [], [], []
    for i in idx:
        ex, eq, ae = _episodes(
            all_scores[i], [table.gold[i], table.hits[i]], table.needed(i), depth, table.query_ids[i]
        )
        exact.append(ex)
        equiv.append(eq)
        all_equiv.append(ae)
    meta = dict(table.meta, scorer=scorer, alpha=alpha if scorer == "hybrid" else None, candidates="full")
    return RankedSet(table.name, scorer, exact, equiv, meta, all_equiv)


def candidate_episodes(
    table: ScoreTable,
    scorer: str,
    n: int,
    *,
    n_hard: int | None = None,
    hard_by: str = "dense",
    seed: int = 0,
    rows: Sequence[int] | None = None,
    depth: int = 60,
    alpha: float = HYBRID_ALPHA,
) -> RankedSet:
    """Rank each query over its own candidate set of ``n`` tools (the paper's protocol).

    The set is the query's gold tools, then its ``n_hard`` highest-scoring non-gold tools under
    ``hard_by`` (``n_hard=None``: all the rest, i.e. no random fill), then tools drawn uniformly
    from the remaining registry. The candidates are ranked under ``scorer``; the episode's
    ``n_tools`` is ``n``. Sets are drawn with ``numpy.random.default_rng(seed)``.

    Args:
        table: full score table.
        scorer: scorer that ranks the candidates.
        n: candidate-set size (``>= 1``; capped at the registry size).
        n_hard: hard distractors per set (default ``n - |gold|``).
        hard_by: scorer that picks the hard distractors (default MiniLM ``"dense"``, so a
            set is the same whichever scorer then ranks it; BM25-only tables use ``"bm25"``).
        seed: random-fill seed.
        rows: query rows to use (default all).
        depth: scores kept per episode.
        alpha: hybrid weight.
    """
    if n < 1:
        raise ValueError(f"candidate-set size must be >= 1, got {n}")
    n = min(n, table.n_tools)
    rng = np.random.default_rng(seed)
    rank_scores = table.scores(scorer, alpha)
    if hard_by == "dense" and table.dense is None:
        hard_by = "bm25"
    hard_scores = table.scores(hard_by, alpha)
    idx = range(table.n_queries) if rows is None else rows
    exact, equiv, all_equiv = [], [], []
    for i in idx:
        must = table.hits[i]
        n_fill = n - must.size
        if n_fill < 0:  # more hits than the set holds: keep the best-ranked ones
            must = must[np.argsort(-hard_scores[i][must], kind="stable")[:n]]
            n_fill = 0
        mask = np.ones(table.n_tools, dtype=bool)
        mask[must] = False
        rest = np.flatnonzero(mask)
        h = n_fill if n_hard is None else min(n_hard, n_fill)
        by_hard = rest[_order(hard_scores[i][rest])]
        hard = by_hard[:h]
        pool = by_hard[h:]
        fill = rng.choice(pool, size=n_fill - h, replace=False) if n_fill > h else pool[:0]
        cand = np.concatenate([must, hard, fill]).astype(np.int64)
        local = {int(t): j for j, t in enumerate(cand)}
        s = rank_scores[i][cand]
        gold_local = np.array([local[int(g)] for g in table.gold[i] if int(g) in local], dtype=np.int64)
        hits_local = np.array([local[int(g)] for g in must], dtype=np.int64)
        needs_local = [
            np.array([local[int(t)] for t in g if int(t) in local], dtype=np.int64)
            for g in table.needed(i)
        ]
        ex, eq, ae = _episodes(s, [gold_local, hits_local], needs_local, depth, table.query_ids[i], cand)
        exact.append(ex)
        equiv.append(eq)
        all_equiv.append(ae)
    meta = dict(
        table.meta, scorer=scorer, alpha=alpha if scorer == "hybrid" else None,
        candidates={"n": n, "n_hard": n_hard, "hard_by": hard_by, "seed": seed},
    )
    return RankedSet(table.name, scorer, exact, equiv, meta, all_equiv)


