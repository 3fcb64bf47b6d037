"""Fit the ``allow_empty`` relevance model (registry/serving/relevance.py) on the dev sets.

Each dev set's queries ranked on its own registry are positives (some tool fits); queries of
the other sets ranked on it are negatives (they were written for other tools; a few may still
fit, which only makes the model more cautious). Logistic regression on
:func:`registry.serving.relevance.relevance_features`, fitted on 70% of the queries; the threshold is
the confidence below which at most ``--max-false-empty`` (default 5%) of the fitting split's
positives fall, so a relevant tool is rarely withheld. Prints held-out figures, then refits on
everything and writes the model.

The gate reads one embedder's scores, so each embedder family has its own (``--embedder``).
``--fold-embedders DIR`` ranks each registry with the fine-tune of ``bench/studies/ranking_loso.py
--finetune --workdir DIR`` that never saw it: the scores a new user's registry gets, which is
what the shipped tuned gate is fitted on. ``--check DIR...`` prints the share of relevant
requests kept on sources the gate was not fitted on.

    python scripts/calibrate_relevance.py --embedder tuned --fold-embedders data/ft_l6s300 --out models/relevance.json
    python scripts/calibrate_relevance.py --embedder minilm --out models/relevance-minilm.json
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ranker_for
from registry.index.embedders import default_embedder
from registry.index.hybrid import SCORERS, Query
from registry.index.lexical import tokenize
from registry.offline.datasets import index_dataset, load_dataset
from registry.serving.relevance import RELEVANCE_WINDOW, RelevanceModel, relevance_features
from registry.settings import EMBEDDERS, Settings

SETS = ("bfcl_simple", "metatool", "toolbench_stable")


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, steps: int = 50) -> np.ndarray:
    """Newton-Raphson (IRLS) for ``P(y=1) = sigmoid(x @ w)``; ``x`` carries a bias column."""
    w = np.zeros(x.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -60, 60)))
        grad = x.T @ (p - y) + l2 * w
        hess = (x * (p * (1 - p))[:, None]).T @ x + l2 * np.eye(x.shape[1])
        w -= np.linalg.solve(hess, grad)
    return w


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--per-set", type=int, default=400, help="queries sampled per set")
    parser.add_argument("--max-false-empty", type=float, default=0.05)
    parser.add_argument("--embedder", choices=EMBEDDERS, default=Settings().embedder,
                        help="the embedder whose scores the gate reads (default: SHORTLIST_EMBEDDER)")
    parser.add_argument("--embedder-cache", type=Path, default=Path("data/cache/embedder"))
    parser.add_argument("--fold-embedders", type=Path, default=None,
                        help="rank each registry with the fine-tune of bench/studies/ranking_loso.py --finetune "
                        "--workdir DIR that held its set out: the tuned model's scores on registries it "
                        "never saw, which is what a new user's registry gets")
    parser.add_argument("--check", type=Path, nargs="*", default=[],
                        help="more source directories (e.g. ../shared/data/train/api_bank): print how many "
                        "of their queries the gate keeps on their own registry")
    parser.add_argument("--out", type=Path, default=None, help="write the refitted model here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    # with --fold-embedders every registry gets its fold's model, so the run-wide one is not loaded
    run_wide = None if args.fold_embedders else default_embedder(
        Settings(embedder=args.embedder, embedder_cache_dir=args.embedder_cache))

    def embedder_for(source: str) -> Any:
        return ranker_for(source, run_wide, args.fold_embedders, None)

    rng = random.Random(args.seed)
    data = {name: load_dataset(args.data / name) for name in SETS}
    queries = {name: rng.sample(d.queries, min(args.per_set, len(d.queries))) for name, d in data.items()}
    rows = []  # (features, label, registry, fit_split)
    vectors_of: dict[tuple[int, str], Any] = {}  # (embedder, set) -> its queries' vectors, embedded once
    for registry, dataset in data.items():
        embedder = embedder_for(registry)
        snapshot = index_dataset(dataset.tools, embedder)
        for source, qs in queries.items():
            key = (id(embedder), source)
            if key not in vectors_of:
                vectors_of[key] = embedder.embed_documents([q.query for q in qs])
            vectors = vectors_of[key]
            for i, q in enumerate(qs):
                prepared = Query(vector=vectors[i], tokens=tokenize(q.query))
                _, scores = SCORERS["hybrid"].rank(prepared, snapshot.dense, snapshot.lexical, RELEVANCE_WINDOW)
                fit = rng.random() < 0.7
                rows.append((relevance_features(scores), float(source == registry), registry, fit))
    x = np.array([[*f, 1.0] for f, *_ in rows])
    y = np.array([r[1] for r in rows])
    fit = np.array([r[3] for r in rows])
    registry_of = np.array([r[2] for r in rows])

    def threshold_for(w: np.ndarray, mask: np.ndarray) -> float:
        p = 1.0 / (1.0 + np.exp(-(x[mask & (y == 1)] @ w)))
        return float(np.quantile(p, args.max_false_empty))

    w = fit_logistic(x[fit], y[fit])
    cut = threshold_for(w, fit)
    p = 1.0 / (1.0 + np.exp(-(x @ w)))
    print(f"embedder {args.embedder}" + (f", held-out folds of {args.fold_embedders}" if args.fold_embedders else ""))
    print(f"held-out ({int((~fit).sum())} query-registry pairs), threshold {cut:.3f}:")
    print("| registry | positives kept | negatives emptied |")
    print("|---|---|---|")
    for registry in (*SETS, "all"):
        m = ~fit & ((registry_of == registry) if registry != "all" else True)
        kept = float(np.mean(p[m & (y == 1)] >= cut))
        emptied = float(np.mean(p[m & (y == 0)] < cut))
        print(f"| {registry} | {kept:.1%} | {emptied:.1%} |")
    model = RelevanceModel(w_top=float(w[0]), w_lead=float(w[1]), bias=float(w[2]), threshold=cut)
    for directory in args.check:
        print(f"| {directory.name} (not fitted on) | {check_source(directory, embedder_for(directory.name), model, rng, args.per_set):.1%} | - |")
    if args.out:
        w_all = fit_logistic(x, y)
        model = RelevanceModel(w_top=float(w_all[0]), w_lead=float(w_all[1]), bias=float(w_all[2]),
                               threshold=threshold_for(w_all, np.ones_like(fit)))
        command = f"python scripts/calibrate_relevance.py --embedder {args.embedder}"
        if args.fold_embedders:
            command += f" --fold-embedders {args.fold_embedders}"
        model.save(args.out, fitted_on=list(SETS), per_set=args.per_set, seed=args.seed,
                   max_false_empty=args.max_false_empty, embedder=args.embedder,
                   held_out_folds=args.fold_embedders is not None,
                   command=f"{command} --out {args.out}")
        print(f"wrote {args.out}: {model}")
    return 0


def check_source(directory: Path, embedder: Any, model: RelevanceModel, rng: random.Random, per_set: int) -> float:
    """Share of ``directory``'s queries (up to ``per_set``) the gate keeps on their own registry."""
    dataset = load_dataset(directory)
    qs = rng.sample(dataset.queries, min(per_set, len(dataset.queries)))
    snapshot = index_dataset(dataset.tools, embedder)
    vectors = embedder.embed_documents([q.query for q in qs])
    kept = 0
    for q, vector in zip(qs, vectors, strict=True):
        prepared = Query(vector=vector, tokens=tokenize(q.query))
        _, scores = SCORERS["hybrid"].rank(prepared, snapshot.dense, snapshot.lexical, RELEVANCE_WINDOW)
        kept += model.confidence(scores) >= model.threshold
    return kept / max(1, len(qs))


if __name__ == "__main__":
    raise SystemExit(main())
