"""Found@1/5/10 of the dense, bm25 and hybrid scorers (and alternatives) on labelled data sets.

    python bench/studies/scorers.py ../shared/data/bfcl_simple ../shared/data/metatool ../shared/data/toolbench_stable

Prints a Markdown table; MetaTool is subsampled (--max-queries, fixed seed) to keep it quick.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import numpy as np

from registry.index.embedders import load_minilm
from registry.index.hybrid import fuse
from registry.index.lexical import tokenize, top_k
from registry.offline.datasets import index_dataset, load_dataset, rank_queries


def found(ranks: list[int], k: int) -> float:
    return 100.0 * float(np.mean([r < k for r in ranks]))


def rrf_ranks(snapshot, queries, vectors, c: int = 60) -> list[int]:
    out = []
    n = snapshot.n_tools
    for i, q in enumerate(queries):
        dense = snapshot.dense.embeddings @ vectors[i]
        lex = snapshot.lexical.scores(tokenize(q.query))
        fused = np.zeros(n, dtype=np.float64)
        for scores in (dense, lex):
            order = np.argsort(-scores, kind="stable")
            fused[order] += 1.0 / (c + np.arange(1, n + 1))
        order = np.argsort(-fused, kind="stable")
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n)
        out.append(min(int(pos[snapshot.by_name[g]]) for g in q.gold))
    return out


def fused_ranks(snapshot, queries, vectors, alpha: float) -> list[int]:
    out = []
    n = snapshot.n_tools
    for i, q in enumerate(queries):
        tokens = tokenize(q.query)
        lexical = snapshot.lexical.scores(tokens)
        if alpha < 0:  # the max-normalised variant, for comparison: cos + |alpha| * bm25 / max bm25
            peak = float(lexical.max())
            scores = snapshot.dense.embeddings @ vectors[i] + (-alpha / peak if peak > 0 else 0.0) * lexical
        else:
            scores = fuse(snapshot.dense.embeddings @ vectors[i], lexical, snapshot.lexical.ceiling(tokens), alpha)
        ids, _ = top_k(scores, n)
        pos = np.empty(n, dtype=np.int64)
        pos[ids] = np.arange(n)
        out.append(min(int(pos[snapshot.by_name[g]]) for g in q.gold))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("data", nargs="+", type=Path)
    parser.add_argument("--max-queries", type=int, default=2000)
    parser.add_argument(
        "--alphas", default="0.4,0.8,1.2,-0.2",
        help="hybrid weights; a negative value -a means the max-normalised variant with weight a",
    )
    parser.add_argument("--cache", type=Path, default=Path("data/cache/embedder"))
    args = parser.parse_args()
    embedder = load_minilm(args.cache)
    alphas = [float(a) for a in args.alphas.split(",")]
    print("| data set | scorer | found@1 | found@5 | found@10 |")
    print("|---|---|---|---|---|")
    for directory in args.data:
        data = load_dataset(directory)
        queries = data.queries
        if len(queries) > args.max_queries:
            queries = random.Random(0).sample(queries, args.max_queries)
        started = time.perf_counter()
        snapshot = index_dataset(data.tools, embedder)
        vectors = embedder.embed_documents([q.query for q in queries])
        rows: dict[str, list[int]] = {}
        for scorer in ("dense", "bm25"):
            episodes = rank_queries(snapshot, queries, embedder, scorer, depth=1)
            rows[scorer] = [e.first_gold_rank for e in episodes]
        for alpha in alphas:
            label = f"hybrid alpha={alpha}" if alpha >= 0 else f"max-normalised alpha={-alpha}"
            rows[label] = fused_ranks(snapshot, queries, vectors, alpha)
        rows["rrf c=60"] = rrf_ranks(snapshot, queries, vectors)
        for name, ranks in rows.items():
            print(
                f"| {data.name} (N={snapshot.n_tools}, q={len(queries)}) | {name} | "
                f"{found(ranks, 1):.1f} | {found(ranks, 5):.1f} | {found(ranks, 10):.1f} |"
            )
        print(f"<!-- {data.name}: {time.perf_counter() - started:.1f}s -->")


if __name__ == "__main__":
    main()
