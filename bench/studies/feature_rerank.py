"""A learned feature reranker (learning to rank) over the hybrid's top 20, under leave-one-source-out.

The first stage is the service's hybrid, ``cos(q, t) + 0.8 * bm25(q, t) / ceiling(q)``
(:func:`registry.offline.ranking.score_source`). Its top ``--depth`` tools (20) are reordered by a
model that reads request and tool together through cheap features, all computable at serving time
from what the service already holds: the first stage's scores and their shape over the candidates
(gap to the top, z-score, dense and BM25 ranks among the candidates), the request's content tokens
(:func:`registry.index.lexical.tokenize`) against the tool's name, description and parameter names
(IDF-weighted shares; IDF over the registry's tool texts, as BM25 keeps it), how much of the tool's
name the request spells, the tool's text length and parameter count, and its cosine to the first
candidate and to the other candidates (redundancy). Tools below the top ``--depth`` keep their place.

Two models, both trained on the other sources only (plain LOSO: one fold per held-out source, 17
folds with the project's MCP tasks):

- ``hgb``: pointwise gradient-boosted trees (``HistGradientBoostingClassifier``, label = the tool is
  needed), query weights capped per source (``--cap`` queries' worth), so no source dominates;
- ``pairwise``: a linear RankNet (logistic regression on feature differences of needed vs
  not-needed candidates of one query), same weights; serving is one dot product.

``gated`` reranks only when the first stage is unsure: top-1 minus top-2 hybrid score below a
threshold chosen on the training sources (mean per-source found@1 of their held-out reranks, each
from the fold that held that source out: cross-fitted, a mild leak of one scalar, stated).

``--fold-vectors DIR`` also measures the reranker on top of a LOSO fine-tune: every source's dense
vectors come from ``DIR/<fold>/<source>-fp32.npz`` of the fine-tune fold that held it out
(:func:`registry.offline.finetune_loso.cached_reembed`), for training and test alike.

Cost: the feature computation plus the model's prediction for one request's 20 candidates, single
thread, median over ``--cost-queries`` requests, timed in the same run.

    OMP_NUM_THREADS=1 nice -n 15 python bench/studies/feature_rerank.py --data ../shared/data \\
        --vectors-cache data/corpus_vectors [--fold-vectors data/ft16/loso] --json docs/generated/feature_rerank.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from registry.index.embed import Embedder
from registry.index.embedders import load_minilm
from registry.index.hybrid import HYBRID_ALPHA
from registry.index.lexical import tokenize
from registry.offline.corpus import DEFAULT_DATA_ROOT, MCP_SOURCE, load_corpus
from registry.offline.corpus_vectors import SourceVectors, corpus_vectors
from registry.offline.datasets import Dataset
from registry.offline.finetune_loso import held_out_embedder, held_out_vectors
from registry.offline.loso_report import MULTI_TOOL_SHARE
from registry.offline.ranking import SourceScore, gold_ranks, pooled, score_ranks
from registry.settings import Settings
from registry.tool_text import split_identifier

DEPTH = 20
GAP_GRID: tuple[float, ...] = (0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, math.inf)
FEATURES: tuple[str, ...] = (
    "hybrid", "dense", "bm25", "rank", "gap_to_top", "hybrid_z", "dense_minus_max", "bm25_minus_max",
    "dense_rank", "bm25_rank", "q_in_name", "q_in_desc", "q_in_params", "name_in_q", "name_all_in_q",
    "log_text_len", "n_params", "cos_to_top", "mean_cos_to_others", "query_top_gap", "log_query_tokens",
    "q_in_text", "q_new_vs_top", "max_cos_to_higher", "log_n_tools",
)
FIELD_FEATURES: tuple[str, ...] = ("cos_name", "cos_desc", "cos_name_minus_max", "cos_desc_minus_max")


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class ToolSide:
    """What a registry keeps per tool for the features, computed once at upload."""

    name_tokens: list[frozenset[str]]
    desc_tokens: list[frozenset[str]]
    param_tokens: list[frozenset[str]]
    text_tokens: list[frozenset[str]]
    log_len: np.ndarray  # log1p(tokens in the tool text)
    n_params: np.ndarray
    idf: dict[str, float]  # BM25's IDF over the registry's tool texts
    default_idf: float  # IDF of a term no tool has
    names: np.ndarray | None = None  # (n_tools, dim) unit vectors of the name's words, or None
    descs: np.ndarray | None = None  # (n_tools, dim) unit vectors of the description (else the name)


def tool_side(data: Dataset) -> ToolSide:
    texts = [set(tokenize(t.text())) for t in data.tools]
    df: dict[str, int] = {}
    for toks in texts:
        for term in toks:
            df[term] = df.get(term, 0) + 1
    n = len(texts)
    idf = {term: math.log(1 + (n - d + 0.5) / (d + 0.5)) for term, d in df.items()}
    params = []
    for t in data.tools:
        props = t.parameters.get("properties") if isinstance(t.parameters, dict) else None
        keys = [str(k) for k in props] if isinstance(props, dict) else []
        params.append(frozenset(w for k in keys for w in tokenize(" ".join(split_identifier(k)) or k)))
    return ToolSide(
        name_tokens=[frozenset(tokenize(" ".join(split_identifier(t.name)) or t.name)) for t in data.tools],
        desc_tokens=[frozenset(tokenize(t.description or "")) for t in data.tools],
        param_tokens=params,
        text_tokens=[frozenset(t) for t in texts],
        log_len=np.log1p(np.array([len(tokenize(t.text())) for t in data.tools], dtype=np.float32)),
        n_params=np.array([len(p) for p in params], dtype=np.float32),
        idf=idf,
        default_idf=math.log(1 + (n + 0.5) / 0.5),
    )


def field_vectors(data: Dataset, embedder: Embedder, cache: Path) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors of each tool's name words and of its description (the name's when it has
    none), embedded once per registry at upload like the tool text; cached under ``cache``."""
    names = [" ".join(split_identifier(t.name)) or t.name for t in data.tools]
    descs = [t.description.strip() or n for t, n in zip(data.tools, names, strict=True)]
    h = hashlib.sha256(embedder.model_id.encode())
    for text in names + descs:
        h.update(text.encode("utf-8", "replace") + b"\x00")
    path = cache / f"{data.name}-fields-{h.hexdigest()[:16]}.npz"
    if path.is_file():
        with np.load(path) as z:
            return z["names"], z["descs"]
    t0 = time.monotonic()
    out = embedder.embed_documents(names, batch_size=64), embedder.embed_documents(descs, batch_size=32)
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, names=out[0], descs=out[1])
    log(f"{data.name}: fields of {len(names)} tools in {time.monotonic() - t0:.0f}s")
    return out


def _ranks_desc(values: np.ndarray) -> np.ndarray:
    order = np.argsort(-values, kind="stable")
    out = np.empty(values.size, dtype=np.float32)
    out[order] = np.arange(values.size, dtype=np.float32)
    return out


def features(
    query: str,
    cand: np.ndarray,
    dense: np.ndarray,
    bm25: np.ndarray,
    tools: np.ndarray,
    side: ToolSide,
    qvec: np.ndarray | None = None,
) -> np.ndarray:
    """The (len(cand), len(FEATURES)) feature matrix of one request's candidates.

    ``cand`` are tool rows in first-stage order; ``dense`` / ``bm25`` are the request's scores of
    those candidates; ``tools`` the candidates' unit vectors. Everything here is what the
    service holds after its first stage.
    """
    k = cand.size
    hyb = dense + HYBRID_ALPHA * bm25
    q_tokens = set(tokenize(query))
    weights = {t: side.idf.get(t, side.default_idf) for t in q_tokens}
    total = sum(weights.values()) or 1.0
    fields = side.names is not None and side.descs is not None and qvec is not None
    out = np.empty((k, len(FEATURES) + (len(FIELD_FEATURES) if fields else 0)), dtype=np.float32)
    out[:, 0] = hyb
    out[:, 1] = dense
    out[:, 2] = bm25
    out[:, 3] = np.arange(k)
    out[:, 4] = hyb - hyb[0]
    out[:, 5] = (hyb - hyb.mean()) / (hyb.std() + 1e-6)
    out[:, 6] = dense - dense.max()
    out[:, 7] = bm25 - bm25.max()
    out[:, 8] = _ranks_desc(dense)
    out[:, 9] = _ranks_desc(bm25)
    top_text = side.text_tokens[int(cand[0])]
    for j, t in enumerate(cand.tolist()):
        name = side.name_tokens[t]
        text = side.text_tokens[t]
        out[j, 21] = sum(w for term, w in weights.items() if term in text) / total
        out[j, 22] = sum(w for term, w in weights.items() if term in text and term not in top_text) / total
        out[j, 10] = sum(w for term, w in weights.items() if term in name) / total
        out[j, 11] = sum(w for term, w in weights.items() if term in side.desc_tokens[t]) / total
        out[j, 12] = sum(w for term, w in weights.items() if term in side.param_tokens[t]) / total
        hit = len(name & q_tokens)
        out[j, 13] = hit / len(name) if name else 0.0
        out[j, 14] = float(bool(name) and hit == len(name))
    out[:, 15] = side.log_len[cand]
    out[:, 16] = side.n_params[cand]
    sims = tools @ tools.T
    out[:, 17] = sims[0]
    out[:, 18] = (sims.sum(axis=1) - 1.0) / max(k - 1, 1)
    out[:, 19] = hyb[0] - hyb[1] if k > 1 else 1.0
    out[:, 20] = math.log1p(len(q_tokens))
    higher = np.where(np.tri(k, k, -1, dtype=bool), sims, -1.0)
    out[:, 23] = np.maximum(higher.max(axis=1), 0.0) if k > 1 else 0.0
    out[0, 23] = 0.0
    out[:, 24] = math.log(len(side.log_len))
    if fields:
        assert side.names is not None and side.descs is not None and qvec is not None
        cn, cd = side.names[cand] @ qvec, side.descs[cand] @ qvec
        base = len(FEATURES)
        out[:, base], out[:, base + 1] = cn, cd
        out[:, base + 2], out[:, base + 3] = cn - cn.max(), cd - cd.max()
    return out


@dataclass(frozen=True, slots=True)
class SourceCands:
    """One source's first stage: per query its candidates, their features and labels."""

    name: str
    cand: list[np.ndarray]
    feats: list[np.ndarray]
    labels: list[np.ndarray]
    first_ranks: list[np.ndarray]  # gold ranks under the first stage (ties in the gold's favour)
    gap: np.ndarray  # top-1 minus top-2 hybrid per query
    multi_share: float
    gold: tuple[tuple[int, ...], ...]


def source_cands(data: Dataset, sv: SourceVectors, side: ToolSide, depth: int) -> SourceCands:
    cands, feats, labels = [], [], []
    gaps = np.empty(len(sv.gold), dtype=np.float32)
    for i, q in enumerate(data.queries):
        dense = sv.tools @ sv.queries[i]
        hyb = dense + HYBRID_ALPHA * sv.bm25[i]
        cand = np.argsort(-hyb, kind="stable")[:depth]
        cands.append(cand)
        feats.append(
            features(q.query, cand, dense[cand], sv.bm25[i][cand], sv.tools[cand], side, sv.queries[i])
        )
        labels.append(np.isin(cand, sv.gold[i]).astype(np.int8))
        gaps[i] = hyb[cand[0]] - hyb[cand[1]] if cand.size > 1 else 1.0
    return SourceCands(
        sv.name, cands, feats, labels, gold_ranks(sv, None, HYBRID_ALPHA), gaps, float(sv.multi_tool.mean()),
        sv.gold,
    )


class Model(Protocol):
    def scores(self, x: np.ndarray) -> np.ndarray: ...


def _weights(train: Sequence[SourceCands], cap: int) -> list[np.ndarray]:
    """Per training source, each usable query's weight: 1, or cap / n so a source counts at most cap queries."""
    out = []
    for sc in train:
        n = sum(1 for y in sc.labels if y.any())
        out.append(np.full(len(sc.labels), min(1.0, cap / max(n, 1)), dtype=np.float32))
    return out


class HGBModel:
    def __init__(self, train: Sequence[SourceCands], cap: int, seed: int = 0) -> None:
        from sklearn.ensemble import HistGradientBoostingClassifier

        xs, ys, ws = [], [], []
        for sc, w in zip(train, _weights(train, cap), strict=True):
            for x, y, wq in zip(sc.feats, sc.labels, w, strict=True):
                if y.any() and not y.all():
                    xs.append(x)
                    ys.append(y)
                    ws.append(np.full(y.size, wq / y.size, dtype=np.float32))
        self.model = HistGradientBoostingClassifier(
            max_iter=200, learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=40,
            l2_regularization=1.0, early_stopping=False, random_state=seed,
        )
        w = np.concatenate(ws)
        self.model.fit(np.concatenate(xs), np.concatenate(ys), sample_weight=w / w.mean())
        self.compiled = OnnxTrees(self.model, xs[0].shape[1])

    def scores(self, x: np.ndarray) -> np.ndarray:
        return self.compiled(x)


class OnnxTrees:
    """The same trees as one ONNX ``TreeEnsembleRegressor`` run by ONNX Runtime on one thread:
    how the service would serve them (it already runs ONNX Runtime for the embedder and policy)."""

    def __init__(self, model: Any, n_features: int) -> None:
        import onnxruntime as ort
        from onnx import TensorProto, helper

        attrs: dict[str, list[Any]] = {k: [] for k in (
            "nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
            "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true",
            "target_treeids", "target_nodeids", "target_ids", "target_weights",
        )}
        for i, p in enumerate(model._predictors):
            for j, node in enumerate(p[0].nodes):
                leaf = bool(node["is_leaf"])
                attrs["nodes_treeids"].append(i)
                attrs["nodes_nodeids"].append(j)
                attrs["nodes_featureids"].append(0 if leaf else int(node["feature_idx"]))
                attrs["nodes_values"].append(0.0 if leaf else float(node["num_threshold"]))
                attrs["nodes_modes"].append("LEAF" if leaf else "BRANCH_LEQ")
                attrs["nodes_truenodeids"].append(0 if leaf else int(node["left"]))
                attrs["nodes_falsenodeids"].append(0 if leaf else int(node["right"]))
                attrs["nodes_missing_value_tracks_true"].append(int(node["missing_go_to_left"]))
                if leaf:
                    attrs["target_treeids"].append(i)
                    attrs["target_nodeids"].append(j)
                    attrs["target_ids"].append(0)
                    attrs["target_weights"].append(float(node["value"]))
        baseline = float(np.asarray(model._baseline_prediction).ravel()[0])
        node = helper.make_node(
            "TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", n_targets=1,
            aggregate_function="SUM", base_values=[baseline], **attrs,
        )
        graph = helper.make_graph(
            [node], "rerank",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, n_features])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])],
        )
        onnx_model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.session.run(None, {"x": x.astype(np.float32, copy=False)})[0][:, 0])


class PairwiseModel:
    def __init__(self, train: Sequence[SourceCands], cap: int) -> None:
        from sklearn.linear_model import LogisticRegression

        all_x = np.concatenate([x for sc in train for x in sc.feats])
        self.mean = all_x.mean(axis=0)
        self.std = all_x.std(axis=0) + 1e-6
        diffs, ws = [], []
        for sc, w in zip(train, _weights(train, cap), strict=True):
            for x, y, wq in zip(sc.feats, sc.labels, w, strict=True):
                pos, neg = np.flatnonzero(y), np.flatnonzero(y == 0)
                if pos.size and neg.size:
                    z = (x - self.mean) / self.std
                    d = (z[pos][:, None, :] - z[neg][None, :, :]).reshape(-1, z.shape[1])
                    diffs.append(d)
                    ws.append(np.full(d.shape[0], wq / d.shape[0], dtype=np.float32))
        d = np.concatenate(diffs)
        w = np.concatenate(ws)
        x2 = np.concatenate([d, -d])
        y2 = np.concatenate([np.ones(len(d)), np.zeros(len(d))])
        fit = LogisticRegression(C=1.0, fit_intercept=False, max_iter=2000)
        fit.fit(x2, y2, sample_weight=np.concatenate([w, w]) / w.mean())
        self.coef = (fit.coef_[0] / self.std).astype(np.float32)

    def scores(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x @ self.coef)


MODELS: dict[str, Callable[[Sequence[SourceCands], int], Model]] = {
    "hgb": lambda train, cap: HGBModel(train, cap),
    "pairwise": lambda train, cap: PairwiseModel(train, cap),
}


def reranked_ranks(sc: SourceCands, model_scores: list[np.ndarray], rerank: np.ndarray) -> list[np.ndarray]:
    """Per query, gold ranks after reordering the candidates by the model (where ``rerank``)."""
    out = []
    for i, first in enumerate(sc.first_ranks):
        if not rerank[i]:
            out.append(first)
            continue
        s, cand = model_scores[i], sc.cand[i]
        ranks = []
        for r0, g in zip(first, sc.gold[i], strict=True):
            hit = np.flatnonzero(cand == g)
            ranks.append(int((s > s[hit[0]]).sum()) if hit.size else max(int(r0), cand.size))
        out.append(np.array(ranks))
    return out


def choose_gap(train: Sequence[SourceCands], reranked: dict[str, list[np.ndarray]]) -> float:
    """The gate with the best mean per-source found@1 over the training sources' held-out reranks."""
    hits = []
    for sc in train:
        first = np.array([r.min() < 1 for r in sc.first_ranks])
        after = np.array([r.min() < 1 for r in reranked[sc.name]])
        hits.append((sc.gap, first, after))

    def objective(tau: float) -> float:
        return float(np.mean([np.where(gap < tau, after, first).mean() for gap, first, after in hits]))

    return max(GAP_GRID, key=objective)


def run(
    label: str, cands: list[SourceCands], cap: int, log: Callable[[str], None], kinds: Sequence[str]
) -> dict[str, Any]:
    """Plain LOSO over ``cands`` for every model: per source first stage / reranked / gated scores."""
    rows: dict[str, dict[str, SourceScore]] = {sc.name: {"first stage": score_ranks(sc.name, sc.first_ranks)} for sc in cands}
    models: dict[str, dict[str, Model]] = {}
    for kind in kinds:
        make = MODELS[kind]
        held: dict[str, list[np.ndarray]] = {}
        reranked: dict[str, list[np.ndarray]] = {}
        models[kind] = {}
        for k, sc in enumerate(cands):
            t0 = time.monotonic()
            model = make(cands[:k] + cands[k + 1 :], cap)
            models[kind][sc.name] = model
            held[sc.name] = [model.scores(x) for x in sc.feats]
            if isinstance(model, HGBModel) and k == 0:  # the ONNX trees are sklearn's decision function
                x = np.concatenate(sc.feats[:100])
                diff = np.abs(model.compiled(x) - model.model.decision_function(x)).max()
                log(f"ONNX trees vs sklearn decision_function on {len(x)} rows: max |diff| {diff:.2e}")
            reranked[sc.name] = reranked_ranks(sc, held[sc.name], np.ones(len(sc.feats), bool))
            rows[sc.name][kind] = score_ranks(sc.name, reranked[sc.name])
            log(f"{label} {kind} fold {sc.name}: {time.monotonic() - t0:.1f}s, found@1 "
                f"{rows[sc.name]['first stage'].found_at_1:.3f} -> {rows[sc.name][kind].found_at_1:.3f}")
        for k, sc in enumerate(cands):
            tau = choose_gap(cands[:k] + cands[k + 1 :], reranked)
            rows[sc.name][f"{kind} gated"] = score_ranks(sc.name, reranked_ranks(sc, held[sc.name], sc.gap < tau))
            rows[sc.name][f"{kind} gated"] = replace(rows[sc.name][f"{kind} gated"], source=f"{sc.name}@{tau}")
    return {"rows": rows, "models": models}


def summarise(rows: dict[str, dict[str, SourceScore]], cands: list[SourceCands]) -> dict[str, Any]:
    multi = {sc.name for sc in cands if sc.multi_share >= MULTI_TOOL_SHARE}
    variants = list(next(iter(rows.values())))
    out: dict[str, Any] = {"multi_tool_sources": sorted(multi), "variants": {}}
    for v in variants:
        scores = [rows[n][v] for n in rows]
        p = pooled(scores)
        p["recall_at_5_multi"] = pooled([rows[n][v] for n in rows if n in multi])["recall_at_5_multi"]
        deltas = {n: rows[n][v].found_at_1 - rows[n]["first stage"].found_at_1 for n in rows}
        worst = min(deltas, key=lambda n: deltas[n])
        out["variants"][v] = {
            **{key: round(100 * val, 2) for key, val in p.items()},
            "worst_source": worst,
            "worst_delta_found_at_1": round(100 * deltas[worst], 2),
            "sources_below_minus_1": sorted(n for n, d in deltas.items() if d < -0.01),
            "per_source": {
                n: {
                    "found_at_1": round(100 * rows[n][v].found_at_1, 2),
                    "found_at_5": round(100 * rows[n][v].found_at_5, 2),
                    "recall_at_5_multi": None if n not in multi else round(100 * rows[n][v].recall_at_5_multi, 2),
                    "gate": rows[n][v].source.partition("@")[2] or None,
                }
                for n in rows
            },
        }
    return out


def format_summary(label: str, summary: dict[str, Any], base: dict[str, Any] | None = None) -> str:
    lines = [f"## {label}", "| ranking | found@1 | found@5 | recall@5 multi | worst source (found@1 delta) | sources < -1 |",
             "|---|---|---|---|---|---|"]
    first = summary["variants"]["first stage"]
    for v, s in summary["variants"].items():
        d1 = s["found_at_1"] - first["found_at_1"]
        d5 = s["found_at_5"] - first["found_at_5"]
        dr = s["recall_at_5_multi"] - first["recall_at_5_multi"]
        lines.append(
            f"| {v} | {s['found_at_1']:.1f} ({d1:+.1f}) | {s['found_at_5']:.1f} ({d5:+.1f}) | "
            f"{s['recall_at_5_multi']:.1f} ({dr:+.1f}) | {s['worst_source']} {s['worst_delta_found_at_1']:+.1f} | "
            f"{len(s['sources_below_minus_1'])} |"
        )
    if base is not None:
        b = base["variants"]["first stage"]
        lines.append(f"(vs hybrid plain MiniLM: found@1 {b['found_at_1']:.1f}, recall@5 multi {b['recall_at_5_multi']:.1f})")
    return "\n".join(lines)


def per_source_table(summary: dict[str, Any]) -> str:
    variants = list(summary["variants"])
    names = list(summary["variants"]["first stage"]["per_source"])
    lines = ["| source | " + " | ".join(variants) + " |", "|---" * (len(variants) + 1) + "|"]
    for n in names:
        cells = []
        for v in variants:
            ps = summary["variants"][v]["per_source"][n]
            cells.append(f"{ps['found_at_1']:.1f}" + (f" / {ps['recall_at_5_multi']:.1f}" if ps["recall_at_5_multi"] is not None else ""))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost(
    data: list[Dataset], vectors: list[SourceVectors], sides: list[ToolSide],
    models: dict[str, Model], n: int, depth: int,
) -> dict[str, float]:
    """Median ms per request: features + model scores for its ``depth`` candidates (one thread)."""
    pairs = [(d, sv, side) for d, sv, side in zip(data, vectors, sides, strict=True)]
    jobs = []
    rng = np.random.default_rng(0)
    for _ in range(n):
        d, sv, side = pairs[int(rng.integers(len(pairs)))]
        i = int(rng.integers(len(d.queries)))
        dense = sv.tools @ sv.queries[i]
        hyb = dense + HYBRID_ALPHA * sv.bm25[i]
        cand = np.argsort(-hyb, kind="stable")[:depth]
        jobs.append((d.queries[i].query, cand, dense[cand], sv.bm25[i][cand], sv.tools, side, sv.queries[i]))
    out: dict[str, float] = {}
    timings: dict[str, list[float]] = {"features": []}
    timings.update({kind: [] for kind in models})
    for query, cand, dense, bm25, tools, side, qvec in jobs * 2:  # the first pass warms up
        t0 = time.perf_counter()
        x = features(query, cand, dense, bm25, tools[cand], side, qvec)
        t1 = time.perf_counter()
        timings["features"].append(t1 - t0)
        for kind, model in models.items():
            t2 = time.perf_counter()
            model.scores(x)
            timings[kind].append(time.perf_counter() - t2 + (t1 - t0))
    for key, values in timings.items():
        out[key] = round(1000 * float(np.median(values[len(jobs):])), 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--vectors-cache", type=Path, default=Path("data/corpus_vectors"))
    parser.add_argument("--embedder-cache", type=Path, default=None)
    parser.add_argument("--max-queries", type=int, default=400)
    parser.add_argument("--max-tools", type=int, default=1000)
    parser.add_argument("--only", nargs="*", default=None, help="just these sources (a smoke run)")
    parser.add_argument("--depth", type=int, default=DEPTH, help="candidates reordered")
    parser.add_argument("--cap", type=int, default=200, help="a training source counts at most this many queries")
    parser.add_argument("--fold-vectors", type=Path, default=None, help="LOSO fine-tune folds (DIR/<fold>/<source>-fp32.npz)")
    parser.add_argument("--cost-queries", type=int, default=300)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument(
        "--tuned-models", nargs="+", choices=sorted(MODELS), default=None,
        help="models for the --fold-vectors table (default: --models)",
    )
    parser.add_argument(
        "--fields", type=Path, default=None,
        help="add cosines to the tool's name and description vectors (embedded once, cached in DIR)",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--cost-only", action="store_true", help="time features + models, no LOSO")
    parser.add_argument("--skip-plain", action="store_true", help="only the --fold-vectors table")
    args = parser.parse_args()

    embedder = load_minilm(args.embedder_cache or Settings().resolved_embedder_cache())
    corpus = load_corpus(
        args.data, max_queries=args.max_queries, max_tools=args.max_tools, only=args.only, extra=[MCP_SOURCE]
    )
    vectors = corpus_vectors(corpus, embedder, args.vectors_cache, log)
    sides = [tool_side(d) for d in corpus]
    if args.fields is not None:
        sides = [with_fields(side, field_vectors(d, embedder, args.fields)) for d, side in zip(corpus, sides, strict=True)]
    report: dict[str, Any] = {"depth": args.depth, "cap": args.cap, "features": list(FEATURES)}
    if args.fields is not None:
        report["features"] += list(FIELD_FEATURES)
    if args.cost_only:  # models of the full size, trained on the smallest sources only (timing needs no LOSO)
        small = sorted(range(len(corpus)), key=lambda i: len(corpus[i].queries))[:4]
        train = [source_cands(corpus[i], vectors[i], sides[i], args.depth) for i in small]
        models = {kind: MODELS[kind](train, args.cap) for kind in args.models}
        report["cost_ms"] = cost(corpus, vectors, sides, models, args.cost_queries, args.depth)
        print(f"cost per request, ms p50 (features + model, {args.depth} candidates, 1 thread): {report['cost_ms']}")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2))
        return 0
    text = []
    if not args.skip_plain:
        t0 = time.monotonic()
        plain = [source_cands(d, sv, side, args.depth) for d, sv, side in zip(corpus, vectors, sides, strict=True)]
        log(f"features of {sum(len(d.queries) for d in corpus)} queries in {time.monotonic() - t0:.0f}s")
        result = run("plain", plain, args.cap, log, args.models)
        report["plain"] = summarise(result["rows"], plain)
        text += [format_summary("hybrid plain MiniLM + rerank", report["plain"]), "", per_source_table(report["plain"])]
        some_models = {kind: next(iter(m.values())) for kind, m in result["models"].items()}
        report["cost_ms"] = cost(corpus, vectors, sides, some_models, args.cost_queries, args.depth)
        text += ["", f"cost per request, ms p50 (features + model, {args.depth} candidates, 1 thread): {report['cost_ms']}"]
    if args.fold_vectors is not None:
        found = [(d, held_out_vectors(args.fold_vectors, sv), side) for d, sv, side in zip(corpus, vectors, sides, strict=True)]
        missing = [d.name for d, sv, _ in found if sv is None]
        if missing:  # folds still training: measure on the sources held out by finished folds
            log(f"no held-out fine-tune vectors yet for {missing}; the tuned table leaves them out")
        report["tuned_missing"] = missing
        held_out = [(d, sv, side) for d, sv, side in found if sv is not None]
        if args.fields is not None:
            held_out = [
                (d, sv, with_fields(side, field_vectors(d, held_out_embedder(args.fold_vectors, d.name), args.fields)))
                for d, sv, side in held_out
            ]
        tuned = [source_cands(d, sv, side, args.depth) for d, sv, side in held_out]
        plain_of = {d.name: sv for d, sv in zip(corpus, vectors, strict=True)}
        first = [source_cands(d, plain_of[d.name], side, args.depth) for d, _, side in held_out]
        tuned_result = run("tuned", tuned, args.cap, log, args.tuned_models or args.models)
        report["tuned"] = summarise(tuned_result["rows"], tuned)
        rows = {sc.name: {"first stage": score_ranks(sc.name, sc.first_ranks)} for sc in first}
        report["plain_same_sources"] = summarise(rows, first)
        text += ["", format_summary("hybrid LOSO fine-tune + rerank", report["tuned"], report["plain_same_sources"]),
                 "", per_source_table(report["tuned"])]
        if missing:
            text.append(f"(not yet held out by a finished fold: {', '.join(missing)})")
    print("\n".join(text))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def with_fields(side: ToolSide, fields: tuple[np.ndarray, np.ndarray]) -> ToolSide:
    return replace(side, names=fields[0], descs=fields[1])


if __name__ == "__main__":
    sys.exit(main())
