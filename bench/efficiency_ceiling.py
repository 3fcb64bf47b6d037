"""How much depth efficiency do the score features carry at all? An in-domain estimate.

    python bench/efficiency_ceiling.py --out docs/generated

For each dev set (hybrid scorer, full registry), fits on 70% of the queries a classifier of
``P(a gold tool is within the top k | depth_features row k)`` (the same 18 features the policy
sees), then on the other 30% picks, per query, the depth maximising ``P(found by k) - lambda * k``
(an oracle-free, globally optimal use of the classifier: it sees every depth's features at
once, which the one-step DQN does not). Sweeping lambda traces found vs mean K; the table
gives the best depth efficiency among operating points that find at least as often as fixed
K=3. This is trained and tested IN-domain, so it bounds what a policy reading these features
can expect on a registry it never saw. About 1 minute on one core per feature set.

``--features extended`` appends 18 query- and tool-aware features that the serving path does
not compute (see :func:`extended_features`: where the dense and the BM25 ranking put the
tools, whether they agree, how similar the next tool is to the ones shown). If they raised the
ceiling, a schema "2" would be worth its serving cost; they do not (docs/results.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from registry.index.minilm_export import load_minilm
from registry.offline.datasets import load_dataset
from registry.offline.metrics import DEFAULT_CAP, depth_efficiency, fixed_curve, found_rate
from registry.offline.score_tables import ScoreTable
from registry.offline.tables import load_or_build_table, rank_table
from registry.serving.features import depth_features

ROOT = Path(__file__).resolve().parent.parent
SETS = (("bfcl_simple", None), ("metatool", 2000), ("toolbench_stable", None))
LAMBDAS = (0.003, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.07, 0.1, 0.15)


def _positions(order: np.ndarray) -> np.ndarray:
    pos = np.empty(order.size, dtype=np.int64)
    pos[order] = np.arange(order.size)
    return pos


def extended_features(table: ScoreTable, tool_vecs: np.ndarray, i: int, order: np.ndarray, d: int) -> np.ndarray:
    """``(d, 18)`` extra features of query ``i`` whose hybrid ranking is ``order``.

    Per query: log2(1 + rank) of the hybrid top tool in the dense and in the BM25 ranking,
    whether dense and BM25 agree on the top tool, the dense top cosine, its gap to the second
    and its z-score in the top 51, the BM25 top score and gap (over the query's IDF sum),
    the number of tools among ranks 2-10 with cosine > 0.7 to the top tool (a cluster of
    near-synonyms). Per depth k: cosine of the k-th and of the next tool to the top tool, the
    next tool's largest cosine to any tool shown, its log2 rank under dense and under BM25,
    the overlap of the hybrid top k with the dense and with the BM25 top k, and the next
    tool's dense cosine and normalised BM25 score.
    """
    dense, lex, ceil = table.dense[i], table.lexical[i], table.ceiling[i]
    dense_order, lex_order = np.argsort(-dense, kind="stable"), np.argsort(-lex, kind="stable")
    dpos, lpos = _positions(dense_order), _positions(lex_order)
    top = order[: d + 1]
    sims = tool_vecs[top] @ tool_vecs[top[0]]
    lex_norm = lex / ceil if ceil > 0 else np.zeros_like(lex)
    ds, ls = dense[dense_order[:51]], lex_norm[lex_order[:51]]
    per_query = [
        np.log2(1 + dpos[top[0]]), np.log2(1 + lpos[top[0]]), float(dense_order[0] == lex_order[0]),
        ds[0], ds[0] - ds[1], (ds[0] - ds.mean()) / (ds.std() + 1e-9), ls[0], ls[0] - ls[1],
        float(np.sum(sims[1:min(d + 1, 11)] > 0.7)),
    ]
    rows, hyb, den, lx = [], set(), set(), set()
    for k in range(1, d + 1):
        hyb.add(int(top[k - 1]))
        den.add(int(dense_order[k - 1]))
        lx.add(int(lex_order[k - 1]))
        nxt = top[min(k, top.size - 1)]
        rows.append([*per_query, sims[k - 1], sims[min(k, sims.size - 1)], float(np.max(tool_vecs[top[:k]] @ tool_vecs[nxt])), np.log2(1 + dpos[nxt]), np.log2(1 + lpos[nxt]), len(hyb & den) / k, len(hyb & lx) / k, dense[nxt], lex_norm[nxt]])
    return np.asarray(rows, dtype=np.float32)


def feature_rows(episodes: list, extra: list[np.ndarray], idx: np.ndarray, cap: int):
    """Per episode in ``idx``: the feature rows (plus ``extra`` columns if any) and the labels
    "a gold tool is within the top k"."""
    xs = [depth_features(episodes[j].scores, episodes[j].n_tools, cap) for j in idx]
    if extra:
        xs = [np.concatenate([x, extra[j]], axis=1) for x, j in zip(xs, idx)]
    ys = [(np.arange(1, len(x) + 1) > episodes[j].first_gold_rank).astype(np.float32) for x, j in zip(xs, idx)]
    return xs, ys


def fit(xs: list[np.ndarray], ys: list[np.ndarray], seed: int, steps: int = 3000):
    torch.manual_seed(seed)
    x = torch.tensor(np.concatenate(xs))
    y = torch.tensor(np.concatenate(ys))
    mu, sd = x.mean(0), x.std(0) + 1e-6
    net = nn.Sequential(nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(net.parameters(), 1e-3, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = torch.randint(len(x), (512,), generator=gen)
        loss = nn.functional.binary_cross_entropy_with_logits(net((x[i] - mu) / sd).squeeze(1), y[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    return lambda f: torch.sigmoid(net((torch.tensor(f) - mu) / sd)).squeeze(1).detach().numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--cap", type=int, default=DEFAULT_CAP)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "generated")
    ap.add_argument("--embedder-cache", type=Path, default=ROOT / "data" / "cache" / "embedder")
    ap.add_argument("--table-cache", type=Path, default=ROOT / "data" / "cache" / "scores")
    ap.add_argument("--features", choices=("base", "extended"), default="base",
                    help="base: the policy's 18 features; extended: plus 18 query/tool-aware ones")
    args = ap.parse_args()
    torch.set_num_threads(1)
    embedder = load_minilm(args.embedder_cache)
    rows = []
    for name, limit in SETS:
        table = load_or_build_table(args.shared / name, embedder, cache_dir=args.table_cache, max_queries=limit)
        ranked = rank_table(table, "hybrid").exact
        keep = [i for i, e in enumerate(ranked) if e.n_gold > 0]
        episodes = [ranked[i] for i in keep]
        extra: list[np.ndarray] = []
        if args.features == "extended":
            tools = load_dataset(args.shared / name).tools
            tool_vecs = embedder.embed_documents([t.text() for t in tools])
            hybrid = table.scores("hybrid")
            for i in keep:
                order = np.lexsort((np.arange(hybrid.shape[1]), -hybrid[i]))
                extra.append(extended_features(table, tool_vecs, i, order, min(args.cap, table.n_tools)))
        best_per_seed = []
        for seed in args.seeds:
            order = np.random.default_rng(seed).permutation(len(episodes))
            n_test = round(0.3 * len(episodes))
            test = [episodes[i] for i in order[:n_test]]

            model = fit(*feature_rows(episodes, extra, order[n_test:], args.cap), seed=seed)
            probs = [np.maximum.accumulate(model(f)) for f in feature_rows(episodes, extra, order[:n_test], args.cap)[0]]
            curve = fixed_curve(test, args.cap)
            points = []
            for lam in LAMBDAS:
                ks = np.array([int(np.argmax(p - lam * np.arange(1, p.size + 1))) + 1 for p in probs])
                found = found_rate(test, ks)
                points.append({"lambda": lam, "found": found, "mean_k": float(ks.mean()),
                               "efficiency": depth_efficiency(curve, found, float(ks.mean()))})
            ok = [p for p in points if p["found"] >= curve[3] - 1e-12]
            best = max(ok, key=lambda p: p["efficiency"]) if ok else None
            best_per_seed.append({"seed": seed, "fk3": float(curve[3]), "best": best, "points": points})
            print(name, seed, best, flush=True)
        rows.append({"dataset": name, "seeds": best_per_seed})
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "ceiling" if args.features == "base" else "ceiling_extended"
    (args.out / f"{stem}.json").write_text(json.dumps(rows, indent=1) + "\n")
    md = [f"Features: {args.features} ({'18' if args.features == 'base' else '36'}).", "",
          "| data set (hybrid, full registry, cap 20) | best efficiency with found >= FK=3, per seed | "
          "found % @ mean K at that point |", "|---|---|---|"]
    for r in rows:
        effs = [f"{s['best']['efficiency']:.2f}" if s["best"] else "none" for s in r["seeds"]]
        pts = [f"{100 * s['best']['found']:.1f} @ {s['best']['mean_k']:.2f} (FK=3 {100 * s['fk3']:.1f})"
               if s["best"] else "–" for s in r["seeds"]]
        md.append(f"| {r['dataset']} | {' / '.join(effs)} | {'; '.join(pts)} |")
    (args.out / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
