"""Benchmark evaluation of depth policies: rankings, metrics, depth efficiency, tables and plots.

The pipeline, each step usable on its own (no HTTP, no FastAPI)::

    table = score_table(data_dir, embedder)           # every query x every tool, base scorers
    ranked = rank_table(table, "hybrid")              # episodes: top scores + gold ranks
    report = evaluate_ranked(ranked, policies)        # found / K / BoR / efficiency / buckets
    write_report(reports, out_dir)                    # results.json, results.md, PNG plots

**Data format** (a directory): ``tools.json`` (any tool JSON the service accepts) and
``queries.jsonl`` with ``{"id", "query", "gold": [names], "gold_alternatives"?: [[names]]}``.
A shown tool is an *exact* hit when it is in ``gold``; it is an *equivalence-aware* hit when
it is in ``gold`` or in any ``gold_alternatives`` group (tools that do the job equally well).
Both found rates are reported side by side; BoR uses ``R_q`` = the size of the hit set.

**Any and all.** A query with several gold tools is a multi-tool task. *Found* (any) means at
least one gold tool is shown; *all found* means every gold tool is shown, i.e. at depth ``K``
every gold rank is ``< K``. Equivalence-aware "all" counts a gold tool as shown when it or one
of its equivalents is (:func:`registry.datasets.needed_groups`); equivalence-aware "any" keeps
the flat hit set. ``BoR_all`` uses ``P_rand_all(N, R_q, K) = C(N-R_q, K-R_q) / C(N, K)``.
On single-gold queries the two coincide.

**Depth efficiency.** For a policy with found rate ``F`` at mean depth ``K_p``, ``K_eq`` is
the fixed depth whose found rate equals ``F``, linearly interpolated on the fixed-K curve
``found(K), K = 0, 1, ..., cap`` (``found(0) = 0``), and efficiency ``= K_eq / K_p``: how many
times more tools a fixed top-K must show to find as often. It is ``inf`` when no fixed depth
up to the cap finds as often.

**Candidate sets** (the paper's protocol): ``candidate_episodes`` builds, per query, a set of
``N`` tools = the gold tools + the highest-scoring non-gold tools ("hard distractors") + random
fill from the rest of the registry, and ranks only those; ``P_rand`` is then computed against
``N``.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from registry.datasets import LabelledQuery, load_dataset, needed_groups
from registry.depth.episodes import Episode
from registry.depth.features import FEATURE_WINDOW
from registry.fsio import json_safe
from registry.index.embed import Embedder
from registry.index.hybrid import HYBRID_ALPHA
from registry.index.lexical import LexicalIndex, tokenize
from registry.metrics import (
    NEEDS,
    PolicyFn,
    depth_efficiency,
    fixed_curve,
    fixed_found_at,
    found_bits,
    found_bits_all,
    k_equivalent,
    needed_ranks,
    policy_depths,
)

__all__ = [
    "DEFAULT_BUCKETS",
    "FIXED_KS",
    "ScoreTable",
    "RankedSet",
    "score_table",
    "load_or_build_table",
    "rank_table",
    "candidate_episodes",
    "NEEDS",
    "needed_ranks",
    "fixed_curve",
    "fixed_found_at",
    "k_equivalent",
    "depth_efficiency",
    "policy_depths",
    "policy_metrics",
    "evaluate_ranked",
    "write_report",
    "markdown_tables",
    "plot_report",
    "load_policies",
    "main",
]

FIXED_KS: tuple[int, ...] = (1, 3, 5, 10, 20, 50)
# Difficulty buckets by the 1-based rank of the best gold tool (paper section 4):
# easy = 1st, medium = 2nd-5th, hard = 6th-20th, very hard = 21st and below.
DEFAULT_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("easy", 1, 1),
    ("medium", 2, 5),
    ("hard", 6, 20),
    ("very hard", 21, None),
)
TABLE_FORMAT_VERSION = 2  # 2: per-query needed groups (for "all found" with equivalents)


# ----------------------------------------------------------------------------- score tables


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

        ``hybrid = cos + alpha * bm25 / ceiling`` exactly as :func:`registry.index.hybrid.fuse`.
        """
        if scorer == "bm25":
            return self.lexical
        if self.dense is None:
            raise ValueError(f"scorer {scorer!r} needs dense scores; build the table with an embedder")
        if scorer == "dense":
            return self.dense
        if scorer == "hybrid":
            scale = np.where(self.ceiling > 0, alpha / np.maximum(self.ceiling, 1e-30), 0.0)
            return (self.dense + scale[:, None].astype(np.float32) * self.lexical).astype(np.float32)
        raise ValueError(f"unknown scorer {scorer!r}; use dense, bm25 or hybrid")

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


def _table_key(directory: Path, embedder: Embedder | None, max_queries: int | None, seed: int) -> str:
    h = hashlib.sha256()
    for part in (
        _sha256_bytes((directory / "tools.json").read_bytes()),
        _sha256_bytes((directory / "queries.jsonl").read_bytes()),
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
    covers caps up to 50 and the :data:`~registry.depth.features.FEATURE_WINDOW` of 51.
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


# ----------------------------------------------------------------------------- metrics


def _bucket_of(rank1: int, buckets: Sequence[tuple[str, int, int | None]]) -> str | None:
    for name, lo, hi in buckets:
        if rank1 >= lo and (hi is None or rank1 <= hi):
            return name
    return None


def policy_metrics(
    name: str,
    ks: np.ndarray,
    ranked: RankedSet,
    cap: int,
    *,
    buckets: Sequence[tuple[str, int, int | None]] = DEFAULT_BUCKETS,
    curves: tuple[np.ndarray, np.ndarray] | None = None,
    all_curves: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Found rates (any and all, exact and equivalence-aware), depth statistics, BoR, efficiency.

    Keys: ``found``, ``found_equiv``, ``mean_k``, ``k_std``, ``k_median``, ``distinct_k``,
    ``mean_p_rand``, ``bor_bits`` (exact hits), ``k_eq``, ``efficiency`` and their
    ``*_equiv`` twins, ``fixed_found_at_mean_k`` (fixed curve interpolated at ``mean_k``),
    and ``buckets``: per difficulty bucket of the exact gold rank, ``n``, ``mean_k``, ``found``,
    ``found_all``.

    Every needed tool shown ("all"): ``found_all``, ``found_all_equiv``, ``n_multi_gold``
    (episodes with >= 2 gold tools), ``mean_p_rand_all``, ``bor_bits_all`` (exact),
    ``k_eq_all`` / ``efficiency_all`` (and ``*_equiv``) on the fixed all-found curve,
    ``fixed_found_all_at_mean_k`` and ``found_all_margin`` (``found_all`` minus it).
    ``curves`` / ``all_curves``: precomputed (exact, equiv) fixed curves, any / all.
    """
    ks = np.asarray(ks, dtype=np.int64)
    exact, equiv = ranked.exact, ranked.equiv
    needed_eq = ranked.needed_equiv()
    curve, curve_eq = curves if curves is not None else (fixed_curve(exact, cap), fixed_curve(equiv, cap))
    if all_curves is None:
        all_curves = (fixed_curve(exact, cap, need="all"), fixed_curve(needed_eq, cap, need="all"))
    curve_all, curve_all_eq = all_curves
    found, mean_pr, bits = found_bits(exact, ks)
    found_eq, mean_pr_eq, bits_eq = found_bits(equiv, ks)
    found_all, mean_pr_all, bits_all = found_bits_all(exact, ks)
    found_all_eq = needed_ranks(needed_eq, "all") < ks
    mean_k = float(ks.mean())
    rate, rate_eq = float(found.mean()), float(found_eq.mean())
    rate_all, rate_all_eq = float(found_all.mean()), float(found_all_eq.mean())
    rows = []
    ranks1 = np.array([e.first_gold_rank + 1 for e in exact])
    for bname, _, _ in buckets:
        sel = np.array([_bucket_of(int(r), buckets) == bname for r in ranks1], dtype=bool)
        n = int(sel.sum())
        rows.append(
            {
                "bucket": bname,
                "n": n,
                "mean_k": float(ks[sel].mean()) if n else math.nan,
                "found": float(found[sel].mean()) if n else math.nan,
                "found_all": float(found_all[sel].mean()) if n else math.nan,
            }
        )
    k_eq = k_equivalent(curve, rate)
    k_eq_eq = k_equivalent(curve_eq, rate_eq)
    k_eq_all = k_equivalent(curve_all, rate_all)
    k_eq_all_eq = k_equivalent(curve_all_eq, rate_all_eq)
    fixed_all_at = fixed_found_at(curve_all, mean_k)
    return {
        "policy": name,
        "n": len(exact),
        "found": rate,
        "found_equiv": rate_eq,
        "mean_k": mean_k,
        "k_std": float(ks.std()),
        "k_median": float(np.median(ks)),
        "distinct_k": int(np.unique(ks).size),
        "mean_p_rand": mean_pr,
        "bor_bits": bits,
        "bor_bits_equiv": bits_eq,
        "k_eq": k_eq,
        "efficiency": k_eq / mean_k if mean_k > 0 else math.nan,
        "k_eq_equiv": k_eq_eq,
        "efficiency_equiv": k_eq_eq / mean_k if mean_k > 0 else math.nan,
        "fixed_found_at_mean_k": fixed_found_at(curve, mean_k),
        "n_multi_gold": int(sum(1 for e in exact if e.n_gold >= 2)),
        "found_all": rate_all,
        "found_all_equiv": rate_all_eq,
        "mean_p_rand_all": mean_pr_all,
        "bor_bits_all": bits_all,
        "k_eq_all": k_eq_all,
        "efficiency_all": k_eq_all / mean_k if mean_k > 0 else math.nan,
        "k_eq_all_equiv": k_eq_all_eq,
        "efficiency_all_equiv": k_eq_all_eq / mean_k if mean_k > 0 else math.nan,
        "fixed_found_all_at_mean_k": fixed_all_at,
        "found_all_margin": rate_all - fixed_all_at,
        "buckets": rows,
    }


def evaluate_ranked(
    ranked: RankedSet,
    policies: Mapping[str, PolicyFn],
    *,
    cap: int = 20,
    fixed_ks: Sequence[int] = FIXED_KS,
    buckets: Sequence[tuple[str, int, int | None]] = DEFAULT_BUCKETS,
    progress: bool = False,
) -> dict[str, Any]:
    """Evaluate fixed-K baselines and ``policies`` on one ranked data set.

    Args:
        ranked: the data set's episodes.
        policies: name -> ``(scores, n_tools, max_k) -> depth``.
        cap: the ``max_k`` every policy gets (the service default is 20).
        fixed_ks: fixed depths to report (those above ``cap`` are skipped).
        buckets: difficulty buckets ``(name, lowest rank, highest rank or None)``, 1-based.
        progress: tqdm bar over policies.

    Returns:
        ``{"dataset", "scorer", "n_tools", "n", "cap", "fixed_curve", "fixed_curve_equiv",
        "found_at": {1, 5, 10}, "policies": [metrics...]}``; fixed-K rows come first. Every
        needed tool shown: ``"n_multi_gold"``, ``"fixed_curve_all"``,
        ``"fixed_curve_all_equiv"``, ``"found_all_at": {1, 5, 10}``.
    """
    curve = fixed_curve(ranked.exact, cap)
    curve_eq = fixed_curve(ranked.equiv, cap)
    all_curves = (
        fixed_curve(ranked.exact, cap, need="all"),
        fixed_curve(ranked.needed_equiv(), cap, need="all"),
    )
    curves = {"curves": (curve, curve_eq), "all_curves": all_curves}
    rows = []
    for k in fixed_ks:
        if k > cap:
            continue
        ks = np.array([min(k, e.scores.size, e.n_tools) for e in ranked.exact], dtype=np.int64)
        rows.append(policy_metrics(f"fixed K={k}", ks, ranked, cap, buckets=buckets, **curves))
    items: Iterable[tuple[str, PolicyFn]] = policies.items()
    if progress:
        from tqdm import tqdm

        items = tqdm(list(items), desc=f"policies {ranked.name}", unit="policy")
    for name, fn in items:
        ks = policy_depths(fn, ranked.exact, cap)
        rows.append(policy_metrics(name, ks, ranked, cap, buckets=buckets, **curves))
    firsts = needed_ranks(ranked.exact, "any")
    lasts = needed_ranks(ranked.exact, "all")
    return {
        "dataset": ranked.name,
        "scorer": ranked.scorer,
        "n_tools": ranked.n_tools_label,
        "n": len(ranked.exact),
        "cap": cap,
        "meta": ranked.meta,
        "fixed_curve": curve.tolist(),
        "fixed_curve_equiv": curve_eq.tolist(),
        "found_at": {str(k): float((firsts < k).mean()) for k in (1, 5, 10)},
        "n_multi_gold": int(sum(1 for e in ranked.exact if e.n_gold >= 2)),
        "fixed_curve_all": all_curves[0].tolist(),
        "fixed_curve_all_equiv": all_curves[1].tolist(),
        "found_all_at": {str(k): float((lasts < k).mean()) for k in (1, 5, 10)},
        "buckets": [list(b) for b in buckets],
        "policies": rows,
    }


# ----------------------------------------------------------------------------- reports


def _pct(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _num(x: float | None, nd: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return f"{x:.{nd}f}"


def markdown_tables(reports: Sequence[Mapping[str, Any]]) -> str:
    """One Markdown section per report: the policy table and the difficulty-bucket table.

    Found (any gold tool shown) and all found (every gold tool shown) sit side by side; reports
    written before "all" existed (no ``found_all`` keys) show "–" there.
    """
    out: list[str] = []
    for rep in reports:
        out.append(
            f"## {rep['dataset']} ({rep['scorer']}, N={rep['n_tools']}, {rep['n']} queries, cap {rep['cap']})\n"
        )
        fa = rep["found_at"]
        fall = rep.get("found_all_at", {})
        out.append(
            f"Scorer found@1/5/10: {_pct(fa['1'])} / {_pct(fa['5'])} / {_pct(fa['10'])}; every gold "
            f"tool found@1/5/10: {_pct(fall.get('1'))} / {_pct(fall.get('5'))} / {_pct(fall.get('10'))} "
            f"({rep.get('n_multi_gold', '–')} of {rep['n']} queries need >= 2 tools). "
            "Efficiency = K_eq / mean K, K_eq = fixed depth with the same found rate (interpolated); "
            "all-found efficiency uses the fixed all-found curve.\n"
        )
        out.append(
            "| policy | found % | found % (equiv.) | all found % | all found % (equiv.) | mean K | K std "
            "| distinct K | BoR bits | BoR all bits | K_eq | efficiency | all: fixed K at mean K % "
            "| all: efficiency |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for p in rep["policies"]:
            out.append(
                f"| {p['policy']} | {_pct(p['found'])} | {_pct(p['found_equiv'])} | "
                f"{_pct(p.get('found_all'))} | {_pct(p.get('found_all_equiv'))} | {_num(p['mean_k'])} | "
                f"{_num(p['k_std'])} | {p['distinct_k']} | {_num(p['bor_bits'])} | "
                f"{_num(p.get('bor_bits_all'))} | {_num(p['k_eq'])} | {_num(p['efficiency'])} | "
                f"{_pct(p.get('fixed_found_all_at_mean_k'))} | {_num(p.get('efficiency_all'))} |"
            )
        names = [b[0] for b in rep["buckets"]]
        counts = {b["bucket"]: b["n"] for b in rep["policies"][0]["buckets"]}
        out.append("")
        out.append("Per difficulty bucket (rank of the best gold tool): mean K / found % / all found %\n")
        out.append("| policy | " + " | ".join(f"{n} (n={counts[n]})" for n in names) + " |")
        out.append("|---|" + "---|" * len(names))
        for p in rep["policies"]:
            cells = [
                f"{_num(b['mean_k'], 1)} / {_pct(b['found'])} / {_pct(b.get('found_all'))}"
                for b in p["buckets"]
            ]
            out.append(f"| {p['policy']} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text).strip("_")


def plot_report(
    rep: Mapping[str, Any],
    out_dir: Path,
    *,
    figure1_policies: Sequence[str] | None = None,
    slug: str | None = None,
) -> list[Path]:
    """Write ``figure1_<set>.png`` (K and found per bucket) and ``curve_<set>.png``.

    ``figure1_policies``: which policies the bucket figure shows (default: every non-fixed
    policy plus fixed K=1 and K=5, like the paper's Figure 1). ``slug`` names the files
    (default ``<dataset>_<scorer>``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    slug = _slug(slug or f"{rep['dataset']}_{rep['scorer']}")
    rows = rep["policies"]
    if figure1_policies is None:
        chosen = [p for p in rows if not p["policy"].startswith("fixed")]
        chosen += [p for p in rows if p["policy"] in ("fixed K=1", "fixed K=5")]
    else:
        chosen = [p for p in rows if p["policy"] in figure1_policies]
    names = [b[0] for b in rep["buckets"]]
    counts = [b["n"] for b in rows[0]["buckets"]]
    x = np.arange(len(names))
    width = 0.8 / max(1, len(chosen))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for j, p in enumerate(chosen):
        ks = [b["mean_k"] for b in p["buckets"]]
        fs = [100 * b["found"] if not math.isnan(b["found"]) else np.nan for b in p["buckets"]]
        axes[0].bar(x + (j - (len(chosen) - 1) / 2) * width, ks, width, label=p["policy"])
        axes[1].bar(x + (j - (len(chosen) - 1) / 2) * width, fs, width, label=p["policy"])
    labels = [f"{n}\n(n={c})" for n, c in zip(names, counts)]
    for ax, title in zip(axes, ("chosen K per bucket", "found % per bucket")):
        ax.set_xticks(x, labels)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("mean K")
    axes[1].set_ylabel("found %")
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{rep['dataset']} ({rep['scorer']}, N={rep['n_tools']}): difficulty buckets")
    fig.tight_layout()
    fig1 = out_dir / f"figure1_{slug}.png"
    fig.savefig(fig1, dpi=110)
    plt.close(fig)

    curve = np.asarray(rep["fixed_curve"])
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    depths = np.arange(1, curve.size)
    ax.plot(depths, 100 * curve[1:], "-", color="0.4", label="fixed K (K = 1..cap)")
    if rep.get("n_multi_gold") and "fixed_curve_all" in rep:
        curve_all = np.asarray(rep["fixed_curve_all"])
        ax.plot(depths, 100 * curve_all[1:], "--", color="0.6", label="fixed K, every gold tool shown")
        for p in rows:
            if not p["policy"].startswith("fixed"):
                ax.plot(p["mean_k"], 100 * p["found_all"], "x", ms=8, label=f"{p['policy']} (all found)")
    for p in rows:
        if p["policy"].startswith("fixed"):
            ax.plot(p["mean_k"], 100 * p["found"], "o", color="0.4", ms=4)
            ax.annotate(p["policy"].replace("fixed ", ""), (p["mean_k"], 100 * p["found"]),
                        fontsize=7, xytext=(3, -9), textcoords="offset points", color="0.3")
        else:
            ax.plot(p["mean_k"], 100 * p["found"], "*", ms=11,
                    label=f"{p['policy']} (eff. {_num(p['efficiency'])})")
    ax.set_xscale("log")
    ax.set_xlabel("mean K (tools shown, log scale)")
    ax.set_ylabel("found %")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"{rep['dataset']} ({rep['scorer']}, N={rep['n_tools']}): found vs mean K")
    fig.tight_layout()
    fig2 = out_dir / f"curve_{slug}.png"
    fig.savefig(fig2, dpi=110)
    plt.close(fig)
    return [fig1, fig2]


def write_report(
    reports: Sequence[Mapping[str, Any]],
    out_dir: Path | str,
    *,
    plots: bool = True,
    img_dir: Path | str | None = None,
) -> dict[str, Path]:
    """Write ``results.json``, ``results.md`` and (``plots``) the PNG figures.

    Figures go to ``img_dir`` (default ``out_dir``); ``results.md`` links them relatively.
    """
    import os

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    img = Path(img_dir) if img_dir is not None else out
    paths = {"json": out / "results.json", "markdown": out / "results.md"}
    paths["json"].write_text(json.dumps(json_safe(list(reports), 6), indent=2) + "\n", encoding="utf-8")
    md = "# Depth-policy evaluation\n\n" + markdown_tables(reports)
    if plots:
        for rep in reports:
            figs = plot_report(rep, img)
            for f in figs:
                paths[f.stem] = f
            md += "\n" + "\n".join(
                f"![{f.stem}]({Path(os.path.relpath(f, out)).as_posix()})" for f in figs
            ) + "\n"
    paths["markdown"].write_text(md, encoding="utf-8")
    return paths


# ----------------------------------------------------------------------------- CLI


def load_policies(paths: Sequence[Path | str], biases: Sequence[float] = (0.0,)) -> dict[str, PolicyFn]:
    """ONNX depth policies by display name ``<manifest name>:<directory name>``.

    Each policy is run at every operating-knob value in ``biases`` (bits, see
    :func:`registry.depth.policies.first_stop`); a non-zero bias is appended to the name,
    e.g. ``bor:default@+0.25``.
    """
    import functools

    from registry.depth.policies import OnnxDepthPolicy

    out: dict[str, PolicyFn] = {}
    for path in paths:
        policy = OnnxDepthPolicy.from_dir(path)
        base = f"{policy.name}:{Path(path).resolve().name}"
        while any(name.split("@")[0] == base for name in out):
            base += "'"
        for bias in biases:
            name = base if bias == 0 else f"{base}@{bias:+g}"
            out[name] = functools.partial(policy.choose_depth, bias=float(bias))
    return out


def _parse_buckets(text: str | None) -> tuple[tuple[str, int, int | None], ...]:
    """``"1,2-5,6-20,21+"`` -> buckets named easy / medium / hard / very hard (or by range)."""
    if not text:
        return DEFAULT_BUCKETS
    parts = [p.strip() for p in text.split(",") if p.strip()]
    names = ["easy", "medium", "hard", "very hard"] if len(parts) == 4 else [None] * len(parts)
    out = []
    for name, part in zip(names, parts):
        if part.endswith("+"):
            lo, hi = int(part[:-1]), None
        elif "-" in part:
            a, b = part.split("-", 1)
            lo, hi = int(a), int(b)
        else:
            lo = hi = int(part)
        out.append((name or part, lo, hi))
    return tuple(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Evaluate depth policies on labelled data sets; write JSON, Markdown and PNG plots."""
    import argparse
    import sys

    from registry.depth.policies import GapPolicy, ThresholdPolicy

    ap = argparse.ArgumentParser(prog="shortlist evaluate", description=main.__doc__)
    ap.add_argument("--data", nargs="+", type=Path, required=True,
                    help="data directories (tools.json + queries.jsonl)")
    ap.add_argument("--policy", nargs="*", type=Path, default=[],
                    help="ONNX policy directories (manifest.json + policy.onnx)")
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--scorer", default="hybrid", choices=["dense", "bm25", "hybrid"])
    ap.add_argument("--cap", type=int, default=20, help="max_k given to every policy (service default 20)")
    ap.add_argument("--candidates", type=int, default=None,
                    help="rank each query over N candidates (gold + hard distractors + random fill) "
                    "instead of the full registry")
    ap.add_argument("--hard", type=int, default=None,
                    help="hard distractors per candidate set (default: all, no random fill)")
    ap.add_argument("--max-queries", type=int, default=None, help="sample this many queries per data set")
    ap.add_argument("--seed", type=int, default=0, help="query sample / random fill seed")
    ap.add_argument("--threshold", type=float, default=0.35, help="score cut-off of the threshold baseline")
    ap.add_argument("--depth-bias", nargs="+", type=float, default=[0.0], metavar="BITS",
                    help="evaluate every --policy at these operating-knob values (bits; > 0 longer "
                         "lists, < 0 shorter; the service's depth_bias)")
    ap.add_argument("--buckets", default=None, help="difficulty buckets by gold rank, e.g. 1,2-3,4-10,11+")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--img", type=Path, default=None, help="write the PNG plots here (default --out)")
    ap.add_argument("--embedder-cache", type=Path, default=None,
                    help="MiniLM ONNX cache (default: the service's, <data_dir>/cache/embedder)")
    ap.add_argument("--table-cache", type=Path, default=None,
                    help="cache score tables here (skips re-embedding on a re-run)")
    args = ap.parse_args(argv)

    embedder = None
    if args.scorer != "bm25":
        from registry.index.embed import load_minilm
        from registry.settings import Settings

        embedder = load_minilm(args.embedder_cache or Settings().resolved_embedder_cache())
    buckets = _parse_buckets(args.buckets)
    policies: dict[str, PolicyFn] = {
        "gap": GapPolicy().choose_depth,
        f"threshold {args.threshold:g}": ThresholdPolicy(args.threshold).choose_depth,
    }
    if any(not -10.0 <= b <= 10.0 for b in args.depth_bias):
        ap.error("--depth-bias values must lie between -10 and 10 bits")
    policies.update(load_policies(args.policy, args.depth_bias))
    reports = []
    from tqdm import tqdm

    for directory in tqdm(args.data, desc="data sets", unit="set"):
        table = load_or_build_table(
            directory, embedder, cache_dir=args.table_cache, max_queries=args.max_queries,
            seed=args.seed, progress=True,
        )
        if args.candidates:
            ranked = candidate_episodes(table, args.scorer, args.candidates, n_hard=args.hard, seed=args.seed)
        else:
            ranked = rank_table(table, args.scorer, depth=max(60, args.cap + 3))
        reports.append(
            evaluate_ranked(ranked, policies, cap=args.cap, buckets=buckets, progress=True)
        )
    paths = write_report(reports, args.out, plots=not args.no_plots, img_dir=args.img)
    for rep in reports:
        best = [p for p in rep["policies"] if not p["policy"].startswith("fixed")]
        for p in best:
            print(
                f"{rep['dataset']:>20s}  {p['policy']:<24s} found {100 * p['found']:5.1f}%  "
                f"all found {100 * p['found_all']:5.1f}% (fixed K at mean K: "
                f"{100 * p['fixed_found_all_at_mean_k']:5.1f}%)  "
                f"mean K {p['mean_k']:5.2f}  efficiency {_num(p['efficiency'])}",
                file=sys.stderr,
            )
    print(f"wrote {paths['markdown']} and {paths['json']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
