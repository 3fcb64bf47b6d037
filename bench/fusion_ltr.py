"""A learned fusion (logistic re-ranking of the hybrid's top candidates) under LOSO.

    python bench/fusion_ltr.py --data ../shared/data --cache data/corpus_vectors [--embedder minilm]

Today's hybrid adds cosine and alpha x normalised BM25 with one fixed alpha. This script asks
whether a re-ranker that reads more of a (request, tool) pair does better on sources it never
saw: per request, the hybrid's top ``--pool`` tools get features (cosine, BM25, their gaps to
the best candidate and ranks, how much of the tool's name and parameter names the request
holds), a logistic regression trained on the other folds' sources (each source weighted
equally) scores them, and found@1 / found@5 / recall@5 on multi-tool requests are printed
against the hybrid on the same candidates, per source and pooled (same corpus, caps and folds
as ``bench/ranking_loso.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from registry.index.hybrid import HYBRID_ALPHA  # noqa: E402
from registry.index.lexical import tokenize  # noqa: E402
from registry.offline.corpus import MCP_SOURCE, load_corpus, loso_folds  # noqa: E402
from registry.offline.corpus_vectors import SourceVectors, corpus_vectors  # noqa: E402
from registry.offline.datasets import Dataset  # noqa: E402
from registry.tool_text import split_identifier  # noqa: E402
from registry.tools import Tool  # noqa: E402

FEATURES = (
    "cos", "bm25", "hybrid", "cos_gap", "bm25_gap", "hybrid_gap", "log_rank_cos", "log_rank_bm25",
    "log_rank_hybrid", "name_cover", "name_any", "name_exact", "param_cover", "desc_cover",
)


def _words(text: str) -> set[str]:
    return set(tokenize(text))


def _tool_words(tool: Tool) -> tuple[set[str], set[str], set[str], str]:
    name = {w.lower() for w in split_identifier(tool.name)} or _words(tool.name)
    props = tool.parameters.get("properties", {}) if isinstance(tool.parameters, dict) else {}
    params: set[str] = set()
    for key in props if isinstance(props, dict) else ():
        params |= {w.lower() for w in split_identifier(str(key))}
    return name, params, _words(tool.description), tool.name.lower()


def source_rows(
    data: Dataset, sv: SourceVectors, pool: int, alpha: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[np.ndarray, set[int]]]]:
    """(features, labels, query index) for every candidate of every request of one source."""
    tool_words = [_tool_words(t) for t in data.tools]
    cos_all = sv.queries @ sv.tools.T
    X, y, qid, golds = [], [], [], []
    for i, q in enumerate(data.queries):
        cos, bm = cos_all[i], sv.bm25[i]
        hyb = cos + alpha * bm
        cand = np.argsort(-hyb, kind="stable")[:pool]
        words = _words(q.query)
        text = q.query.lower()
        c, b, h = cos[cand], bm[cand], hyb[cand]
        rank = {name: np.argsort(np.argsort(-v, kind="stable"), kind="stable") for name, v in (("c", c), ("b", b), ("h", h))}
        feats = np.zeros((cand.size, len(FEATURES)), np.float32)
        for j, t in enumerate(cand.tolist()):
            name, params, desc, raw = tool_words[t]
            feats[j, 9] = len(name & words) / max(1, len(name))
            feats[j, 10] = float(bool(name & words))
            feats[j, 11] = float(raw in text)
            feats[j, 12] = len(params & words) / max(1, len(params)) if params else 0.0
            feats[j, 13] = len(desc & words) / max(1, len(words))
        feats[:, 0], feats[:, 1], feats[:, 2] = c, b, h
        feats[:, 3], feats[:, 4], feats[:, 5] = c - c.max(), b - b.max(), h - h.max()
        feats[:, 6] = np.log1p(rank["c"])
        feats[:, 7] = np.log1p(rank["b"])
        feats[:, 8] = np.log1p(rank["h"])
        gold = set(sv.gold[i])
        X.append(feats)
        y.append(np.array([t in gold for t in cand.tolist()], np.float32))
        qid.append(np.full(cand.size, i))
        golds.append((cand, gold))
    return np.concatenate(X), np.concatenate(y), np.concatenate(qid), golds


def fit_logistic(X: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float = 1e-3, steps: int = 300) -> np.ndarray:
    """Weighted L2 logistic regression by Newton steps; returns (mean, std, coef) packed."""
    mu, sd = X.mean(0), X.std(0) + 1e-6
    Z = np.hstack([(X - mu) / sd, np.ones((X.shape[0], 1), np.float32)]).astype(np.float64)
    beta = np.zeros(Z.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-Z @ beta))
        g = Z.T @ (w * (p - y)) + l2 * beta
        H = (Z * (w * p * (1 - p))[:, None]).T @ Z + l2 * np.eye(Z.shape[1])
        step = np.linalg.solve(H, g)
        beta -= step
        if np.abs(step).max() < 1e-6:
            break
    return np.concatenate([mu, sd, beta])


def fit_listwise(X: np.ndarray, y: np.ndarray, qid: np.ndarray, w: np.ndarray, hidden: int = 0,
                 steps: int = 400, l2: float = 1e-4) -> Callable[[np.ndarray], np.ndarray]:
    """Per request, softmax cross-entropy of its gold tools over its candidates (requests weighted
    by ``w``); a linear scorer (or one hidden layer), returned as the function scoring rows."""
    import torch

    torch.manual_seed(0)
    mu, sd = X.mean(0), X.std(0) + 1e-6
    Z = torch.from_numpy(((X - mu) / sd).astype(np.float32))
    Y = torch.from_numpy(y)
    _, inverse = np.unique(qid, return_inverse=True)
    Q = torch.from_numpy(inverse)
    n_q = int(inverse.max()) + 1
    W = torch.zeros(n_q).index_add_(0, Q, torch.from_numpy(w.astype(np.float32))) / torch.bincount(Q)
    net = torch.nn.Sequential(torch.nn.Linear(Z.shape[1], hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)) \
        if hidden else torch.nn.Linear(Z.shape[1], 1)
    opt = torch.optim.Adam(net.parameters(), lr=0.05 if not hidden else 0.01, weight_decay=l2)
    for _ in range(steps):
        s = net(Z).squeeze(1)
        m = torch.zeros(n_q).index_reduce_(0, Q, s.detach(), "amax", include_self=False)
        e = torch.exp(s - m[Q])
        log_z = torch.log(torch.zeros(n_q).index_add_(0, Q, e)) + m
        gold_n = torch.zeros(n_q).index_add_(0, Q, Y).clamp(min=1)
        nll = torch.zeros(n_q).index_add_(0, Q, Y * (log_z[Q] - s)) / gold_n
        loss = (W * nll).sum() / W.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return lambda Xt: net(torch.from_numpy(((Xt - mu) / sd).astype(np.float32))).squeeze(1).detach().numpy()


def predict(model: np.ndarray, X: np.ndarray) -> np.ndarray:
    f = X.shape[1]
    mu, sd, beta = model[:f], model[f : 2 * f], model[2 * f :]
    return ((X - mu) / sd) @ beta[:-1] + beta[-1]


def evaluate(golds: list[tuple[np.ndarray, set[int]]], scores: np.ndarray, qid: np.ndarray) -> dict[str, float]:
    found1, found5, recall = [], [], []
    for i, (cand, gold) in enumerate(golds):
        s = scores[qid == i]
        order = cand[np.argsort(-s, kind="stable")]
        top = order[:5].tolist()
        found1.append(order[0] in gold)
        found5.append(bool(gold & set(top)))
        if len(gold) > 1:
            recall.append(len(gold & set(top)) / len(gold))
    return {"n": len(found1), "found_at_1": float(np.mean(found1)), "found_at_5": float(np.mean(found5)),
            "n_multi": len(recall), "recall_at_5_multi": float(np.mean(recall)) if recall else float("nan")}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--cache", type=Path, default=ROOT / "data" / "corpus_vectors")
    ap.add_argument("--embedder", default="minilm")
    ap.add_argument("--pool", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--listwise", action="store_true", help="softmax loss per request (else pointwise logistic)")
    ap.add_argument("--hidden", type=int, default=0, help="one hidden layer of this width (listwise only)")
    args = ap.parse_args(argv)

    from registry.index.minilm_export import default_embedder
    from registry.settings import Settings

    corpus = load_corpus(args.data, max_queries=400, max_tools=1000, seed=0, extra=[MCP_SOURCE])
    embedder = default_embedder(Settings(embedder=args.embedder))
    vectors = {sv.name: sv for sv in corpus_vectors(corpus, embedder, args.cache)}
    rows = {d.name: source_rows(d, vectors[d.name], args.pool, HYBRID_ALPHA) for d in corpus}
    folds = loso_folds({d.name: len(d.queries) for d in corpus})
    out = {}
    for fold in folds:
        X = np.concatenate([rows[n][0] for n in fold.train])
        y = np.concatenate([rows[n][1] for n in fold.train])
        w = np.concatenate([np.full(rows[n][1].size, 1.0 / rows[n][1].size) for n in fold.train])
        qids = np.concatenate([rows[n][2] + 100_000 * k for k, n in enumerate(fold.train)])
        model = fit_listwise(X, y, qids, w * len(w), hidden=args.hidden) if args.listwise else fit_logistic(X, y, w * len(w))
        for name in fold.test:
            Xt, _, qid, golds = rows[name]
            out[name] = {"hybrid": evaluate(golds, Xt[:, 2], qid), "learned": evaluate(golds, model(Xt) if args.listwise else predict(model, Xt), qid)}
            h, lr = out[name]["hybrid"], out[name]["learned"]
            print(f"{name:24s} found@1 {100*h['found_at_1']:5.1f} -> {100*lr['found_at_1']:5.1f}  "
                  f"found@5 {100*h['found_at_5']:5.1f} -> {100*lr['found_at_5']:5.1f}  "
                  f"recall@5 multi {100*h['recall_at_5_multi']:5.1f} -> {100*lr['recall_at_5_multi']:5.1f}", flush=True)
        if not args.listwise:
            print("  coefficients:", dict(zip(FEATURES, np.round(model[2 * len(FEATURES):-1], 2).tolist())), flush=True)
    for kind in ("hybrid", "learned"):
        n = sum(o[kind]["n"] for o in out.values())
        m = sum(o[kind]["n_multi"] for o in out.values())
        f1 = sum(o[kind]["found_at_1"] * o[kind]["n"] for o in out.values()) / n
        r5 = sum(o[kind]["recall_at_5_multi"] * o[kind]["n_multi"] for o in out.values() if o[kind]["n_multi"]) / m
        print(f"pooled {kind}: found@1 {100*f1:.1f}, recall@5 multi {100*r5:.1f} ({n} queries, {m} multi)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
