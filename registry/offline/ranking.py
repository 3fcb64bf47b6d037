"""Ranking quality of a (possibly adapted) embedder over cached corpus vectors, and LOSO runs.

Scores are the service's flat hybrid, ``cos(q, t) + alpha * bm25(q, t) / ceiling(q)``
(:func:`registry.index.hybrid.fuse`), computed for every query x tool of a source at once.
A tool's rank is the number of tools scoring strictly higher (ties in its favour).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from registry.offline.adapter import AdapterRecipe, apply_adapter, fit_adapter
from registry.offline.corpus import Fold
from registry.offline.corpus_vectors import SourceVectors

RECALL_DEPTH = 5
ALPHA_GRID: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.3, 1.6, 2.0)


@dataclass(frozen=True, slots=True)
class SourceScore:
    """found@1 over all queries; recall@5 (share of needed tools in the top 5) over multi-tool ones."""

    source: str
    n_queries: int
    found_at_1: float
    found_at_5: float
    n_multi: int
    recall_at_5_multi: float


def gold_ranks(sv: SourceVectors, weight: np.ndarray | None, alpha: float) -> list[np.ndarray]:
    """Per query, the 0-based rank of each gold tool under the hybrid with ``alpha``."""
    queries = apply_adapter(sv.queries, weight)
    tools = apply_adapter(sv.tools, weight)
    out = []
    for start in range(0, queries.shape[0], 512):
        scores = queries[start : start + 512] @ tools.T + alpha * sv.bm25[start : start + 512]
        for i, row in enumerate(scores):
            gold = np.array(sv.gold[start + i], dtype=np.int64)
            out.append((row[None, :] > row[gold][:, None]).sum(axis=1))
    return out


def score_source(sv: SourceVectors, weight: np.ndarray | None, alpha: float) -> SourceScore:
    return score_ranks(sv.name, gold_ranks(sv, weight, alpha))


def score_ranks(name: str, ranks: Sequence[np.ndarray]) -> SourceScore:
    """A source's scores from each query's needed tools' 0-based ranks (any ranker's)."""
    best = np.array([r.min() for r in ranks])
    multi = [r for r in ranks if r.size > 1]
    recall = float(np.mean([(r < RECALL_DEPTH).mean() for r in multi])) if multi else float("nan")
    return SourceScore(
        name, len(ranks), float((best < 1).mean()), float((best < 5).mean()), len(multi), recall
    )


def pooled(scores: Sequence[SourceScore]) -> dict[str, float]:
    """Query-weighted found@1 / found@5 and multi-query-weighted recall@5 over ``scores``."""
    n = sum(s.n_queries for s in scores)
    m = sum(s.n_multi for s in scores)
    return {
        "found_at_1": sum(s.found_at_1 * s.n_queries for s in scores) / n,
        "found_at_5": sum(s.found_at_5 * s.n_queries for s in scores) / n,
        "recall_at_5_multi": sum(s.recall_at_5_multi * s.n_multi for s in scores if s.n_multi) / m
        if m
        else float("nan"),
    }


def best_alpha(
    sources: Sequence[SourceVectors], weight: np.ndarray | None, grid: Sequence[float] = ALPHA_GRID
) -> float:
    """The fusion weight with the best mean per-source found@1 (each source counts once)."""
    def mean_found(alpha: float) -> float:
        return float(np.mean([score_source(sv, weight, alpha).found_at_1 for sv in sources]))

    return max(grid, key=mean_found)


@dataclass(frozen=True, slots=True)
class FoldResult:
    fold: Fold
    alpha: float
    weight: np.ndarray
    losses: list[float]
    scores: list[SourceScore]


def run_loso(
    sources: Sequence[SourceVectors],
    folds: Sequence[Fold],
    recipe: AdapterRecipe,
    *,
    tune_alpha: bool = True,
    log: Callable[[str], None] = lambda _: None,
) -> list[FoldResult]:
    """Per fold: fit on its train sources, pick ``alpha`` on them, score its test sources."""
    by_name = {sv.name: sv for sv in sources}
    results = []
    for fold in folds:
        train = [by_name[n] for n in fold.train]
        fit = fit_adapter(train, recipe, log)
        alpha = best_alpha(train, fit.weight) if tune_alpha else recipe.alpha
        scores = [score_source(by_name[n], fit.weight, alpha) for n in fold.test]
        log(f"fold {fold.test}: alpha {alpha}, fit {fit.seconds:.0f}s")
        results.append(FoldResult(fold, alpha, fit.weight, fit.losses, scores))
    return results
