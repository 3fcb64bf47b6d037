"""Late interaction (ColBERT MaxSim) as a second stage over the shipped hybrid's top candidates, under LOSO.

The request's token vectors are the last layer's states of the forward pass the service already
runs (the tuned MiniLM graph with its ``token_output``, :mod:`registry.index.minilm_graph`); a
tool's token vectors are the same states of its text, projected to ``--dim`` dimensions by a
learned linear map, L2-normalised and stored as int8 (one fp16 scale per token). For each of the
first stage's top ``C`` tools::

    late(q, t)  = mean_i max_j  <P q_i / |P q_i|, P t_j / |P t_j|>            (MaxSim, ColBERT)
    final(q, t) = hybrid(q, t) + w * late(q, t)                                (top C reordered)

A request's tokens each pick their best match in a tool, so the parts of a multi-intent request
can each match a different tool. ``P`` is trained (torch, offline) with a contrastive MaxSim loss
whose negatives are the first stage's own top-20 on the training registries, and ``w`` is the
grid value with the best pooled found@1 on the training sources. Sources are held out in grouped
folds (``--folds``; the two MCP-server sources share their tools, so they are one group). The
baselines are measured on the same queries in the same run: the shipped first stage (tuned
MiniLM + BM25 hybrid, shorthand spelled out) and hybrid plain MiniLM; ``raw384`` is MaxSim on the
unprojected fp32 states (no training) with its ``w`` chosen the same way. Token vectors are cached
per source under ``--cache`` (resumable)::

    nice -n 10 python bench/studies/late_interaction.py --data ../shared/data --cache /tmp/late_cache \\
        --max-queries 120 --max-tools 300 --json docs/generated/late_interaction.json

The cost part times, in one process, the shipped first stage at N=500 (forward pass + hybrid)
and the rerank of its top 20 / 30 (project the request's tokens, MaxSim against int8 tool tokens,
fuse), per request on one thread.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# One BLAS thread per call, as the service sets it (registry.runtime.limit_native_threads): a
# multi-threaded BLAS on small matrices of a loaded machine timed the rerank 5-30x slower.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import NAMED_MISSES
from registry.index.embed import _load_tokenizer
from registry.index.hybrid import HYBRID_ALPHA
from registry.index.lexical import LexicalIndex, tokenize
from registry.index.minilm_export import DELTA_FILE, minilm_model_dir
from registry.offline.corpus import MCP_SOURCE, load_corpus, loso_folds, tool_texts
from registry.offline.corpus_vectors import bm25_matrix
from registry.offline.datasets import Dataset
from registry.offline.loso_report import MULTI_TOOL_SHARE
from registry.offline.ranking import SourceScore, pooled, score_ranks
from registry.serving.shorthand import expand_shorthand
from registry.tools import parse_tools

ROOT = Path(__file__).resolve().parents[2]
NEW_MCP_TASKS = ROOT / "bench" / "data" / "mcp_servers_new_tasks"
MCP_GROUP = ("mcp_servers", "mcp_servers_new_tasks")
TRAIN_NEGATIVES = 20
CANDIDATES = (20, 30)
W_GRID = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
TOKEN_OUTPUT = "token_embeddings"


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the forward pass, token states kept


class TokenEncoder:
    """The service's MiniLM graph with the token output, run unpadded per batch of similar length."""

    def __init__(self, name: str, tuned: bool, cache: Path, threads: int = 2) -> None:
        import onnxruntime as ort

        path = cache / f"{name}-tokens.onnx"
        model_dir = minilm_model_dir()
        if not path.is_file():
            from registry.index.minilm_graph import build_sentence_encoder, load_weights

            config, weights = load_weights(model_dir, ROOT / "models" / "tuned-embedder" / DELTA_FILE if tuned else None)
            model = build_sentence_encoder(config, weights, token_output=TOKEN_OUTPUT)
            cache.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(model.SerializeToString())
            tmp.replace(path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.enable_cpu_mem_arena = False
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.tokenizer, self.pad_id, _ = _load_tokenizer(model_dir / "tokenizer.json", 256)
        self.name = name

    def encode(self, texts: Sequence[str], batch: int = 16) -> tuple[np.ndarray, list[np.ndarray]]:
        """Pooled vectors ``(n, 384)`` and each text's token states ``(len_i, 384)``."""
        encodings = self.tokenizer.encode_batch(list(texts))
        order = np.argsort([len(e.ids) for e in encodings], kind="stable")
        pooled = np.zeros((len(texts), 384), np.float32)
        tokens: list[np.ndarray] = [np.zeros((0, 384), np.float32)] * len(texts)
        for start in range(0, len(order), batch):
            rows = order[start : start + batch]
            width = max(len(encodings[i].ids) for i in rows)
            ids = np.full((len(rows), width), self.pad_id, np.int64)
            mask = np.zeros((len(rows), width), np.int64)
            for r, i in enumerate(rows):
                n = len(encodings[i].ids)
                ids[r, :n] = encodings[i].ids
                mask[r, :n] = 1
            out, states = self.session.run(
                None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            )
            for r, i in enumerate(rows):
                pooled[i] = out[r]
                tokens[i] = states[r, : int(mask[r].sum())]
        return pooled, tokens


@dataclass
class SourceTokens:
    name: str
    tool_pooled: np.ndarray
    tool_tokens: list[np.ndarray]  # fp16, (len, 384) each
    query_pooled: np.ndarray
    query_tokens: list[np.ndarray]
    bm25: np.ndarray
    gold: tuple[tuple[int, ...], ...]

    @property
    def multi(self) -> np.ndarray:
        return np.array([len(g) > 1 for g in self.gold])


def _pack(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.cumsum([0] + [len(a) for a in arrays]).astype(np.int64)
    flat = np.concatenate(arrays).astype(np.float16) if arrays else np.zeros((0, 384), np.float16)
    return flat, offsets


def _unpack(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    return [flat[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def source_tokens(data: Dataset, encoder: TokenEncoder, cache: Path, shorthand: bool) -> SourceTokens:
    """One source's pooled vectors, token states and BM25 (queries as the service reads them)."""
    texts = tool_texts(data.tools)
    queries = [expand_shorthand(q.query) if shorthand else q.query for q in data.queries]
    row = {tool.name: i for i, tool in enumerate(data.tools)}
    gold = tuple(tuple(row[g] for g in q.gold) for q in data.queries)
    h = hashlib.sha256(encoder.name.encode())
    for text in [*texts, "\x01", *queries]:
        h.update(text.encode("utf-8", "replace") + b"\x00")
    path = cache / "tokens" / f"{encoder.name}-{data.name}-{h.hexdigest()[:16]}.npz"
    if path.is_file():
        with np.load(path) as z:
            return SourceTokens(
                data.name, z["tool_pooled"], _unpack(z["tool_flat"], z["tool_off"]), z["query_pooled"],
                _unpack(z["query_flat"], z["query_off"]), z["bm25"], gold,
            )
    start = time.monotonic()
    tool_pooled, tool_tok = encoder.encode(texts)
    query_pooled, query_tok = encoder.encode(queries, batch=32)
    bm25 = bm25_matrix(texts, queries)
    tool_flat, tool_off = _pack(tool_tok)
    query_flat, query_off = _pack(query_tok)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, tool_pooled=tool_pooled, tool_flat=tool_flat, tool_off=tool_off, query_pooled=query_pooled,
             query_flat=query_flat, query_off=query_off, bm25=bm25)
    tmp.replace(path)
    log(f"{encoder.name} {data.name}: {len(texts)} tools ({len(tool_flat)} tokens), {len(queries)} queries "
        f"in {time.monotonic() - start:.0f}s")
    return SourceTokens(data.name, tool_pooled, _unpack(tool_flat, tool_off), query_pooled,
                        _unpack(query_flat, query_off), bm25, gold)


# ---------------------------------------------------------------- scoring


def first_stage(st: SourceTokens) -> np.ndarray:
    return st.query_pooled @ st.tool_pooled.T + HYBRID_ALPHA * st.bm25


def quantise(tokens: np.ndarray, projection: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Project, L2-normalise and store as int8 with one scale per token (what upload would keep)."""
    x = tokens.astype(np.float32) @ projection if projection is not None else tokens.astype(np.float32)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    scale = np.maximum(np.abs(x).max(axis=1, keepdims=True), 1e-12) / 127.0
    return np.round(x / scale).astype(np.int8), scale.astype(np.float16)


def query_side(tokens: np.ndarray, projection: np.ndarray | None) -> np.ndarray:
    x = tokens.astype(np.float32) @ projection if projection is not None else tokens.astype(np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def maxsim(query: np.ndarray, tool_q: np.ndarray, tool_scale: np.ndarray) -> float:
    """Mean over the request's tokens of the best cosine with any of the tool's tokens."""
    sims = (query @ tool_q.T.astype(np.float32)) * tool_scale.astype(np.float32).T
    return float(sims.max(axis=1).mean())


def maxsim_many(query: np.ndarray, tools: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """:func:`maxsim` for several tools in one matrix product (how a serving stage would do it)."""
    tokens = np.concatenate([t for t, _ in tools]).astype(np.float32)
    scales = np.concatenate([s for _, s in tools]).astype(np.float32)[:, 0]
    sims = (query @ tokens.T) * scales
    starts = np.cumsum([0] + [len(t) for t, _ in tools[:-1]])
    return np.maximum.reduceat(sims, starts, axis=1).mean(axis=0)


def late_scores(st: SourceTokens, cand: np.ndarray, projection: np.ndarray | None, int8: bool = True) -> np.ndarray:
    """``late(q, t)`` for each query's candidate tools: ``(n_queries, C)``."""
    tools: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    out = np.zeros(cand.shape, np.float32)
    for qi in range(cand.shape[0]):
        q = query_side(st.query_tokens[qi], projection)
        for ci, t in enumerate(cand[qi]):
            t = int(t)
            if t not in tools:
                if int8:
                    tools[t] = quantise(st.tool_tokens[t], projection)
                else:
                    x = query_side(st.tool_tokens[t], projection)
                    tools[t] = (x, np.ones((len(x), 1), np.float16))
            out[qi, ci] = maxsim(q, *tools[t])
    return out


def ranks_after(s1: np.ndarray, cand: np.ndarray, late: np.ndarray, w: float, gold: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """The gold tools' 0-based ranks when the top ``C`` are reordered by ``s1 + w * late``."""
    out = []
    for qi, g in enumerate(gold):
        c = cand[qi]
        fused = s1[qi, c] + w * late[qi]
        order = c[np.argsort(-fused, kind="stable")]
        pos = {int(t): r for r, t in enumerate(order)}
        row = s1[qi]
        ranks = []
        for t in g:
            if t in pos:
                ranks.append(pos[t])
            else:
                ranks.append(int((row > row[t]).sum()))  # below the reordered top C: unchanged
        out.append(np.array(ranks))
    return out


def plain_ranks(scores: np.ndarray, gold: Sequence[Sequence[int]]) -> list[np.ndarray]:
    return [np.array([(scores[qi] > scores[qi, t]).sum() for t in g]) for qi, g in enumerate(gold)]


def top_candidates(s1: np.ndarray, c: int) -> np.ndarray:
    c = min(c, s1.shape[1])
    part = np.argpartition(-s1, c - 1, axis=1)[:, :c]
    order = np.argsort(-np.take_along_axis(s1, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


# ---------------------------------------------------------------- training the projection


def train_projection(
    sources: list[SourceTokens], dim: int, *, epochs: int, seed: int, temperature: float = 0.05, lr: float = 2e-3,
    residual: bool = False,
) -> np.ndarray:
    """``P`` (384 x dim): contrastive MaxSim over each query's first-stage top-20 plus its gold tools.

    ``residual``: the logits are ``(hybrid + a * late) / temperature`` with ``a`` learnt too, so ``P``
    learns what the first stage misses rather than re-learning what it already ranks right.
    """
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(2)
    rng = np.random.default_rng(seed)
    # Start from the principal directions of the training tools' tokens.
    sample = np.concatenate([np.concatenate(s.tool_tokens[:200]) for s in sources]).astype(np.float32)
    sample = sample[rng.choice(len(sample), min(len(sample), 50_000), replace=False)]
    sample -= sample.mean(axis=0)
    _, _, vt = np.linalg.svd(sample, full_matrices=False)
    weight = torch.nn.Parameter(torch.tensor(vt[:dim].T.copy()))
    log_a = torch.nn.Parameter(torch.zeros(()))
    optimiser = torch.optim.Adam([weight, log_a] if residual else [weight], lr=lr)
    firsts = [torch.from_numpy(first_stage(s)) for s in sources]

    batches: list[tuple[int, np.ndarray]] = []
    cands: list[np.ndarray] = []
    for si, s in enumerate(sources):
        cand = top_candidates(first_stage(s), TRAIN_NEGATIVES)
        cands.append(cand)
        qs = np.arange(len(s.gold))
        for start in range(0, len(qs), 16):
            batches.append((si, qs[start : start + 16]))
    for epoch in range(epochs):
        total, steps = 0.0, 0
        for bi in rng.permutation(len(batches)):
            si, qs = batches[bi]
            s = sources[si]
            sets = [sorted(set(cands[si][q].tolist()) | set(s.gold[q])) for q in qs]
            union = sorted(set().union(*sets))
            at = {t: i for i, t in enumerate(union)}
            lens = [len(s.tool_tokens[t]) for t in union]
            width = max(lens)
            tool = torch.zeros(len(union), width, 384)
            tmask = torch.zeros(len(union), width, dtype=torch.bool)
            for i, t in enumerate(union):
                tool[i, : lens[i]] = torch.from_numpy(s.tool_tokens[t].astype(np.float32))
                tmask[i, : lens[i]] = True
            qlens = [len(s.query_tokens[q]) for q in qs]
            qwidth = max(qlens)
            query = torch.zeros(len(qs), qwidth, 384)
            qmask = torch.zeros(len(qs), qwidth)
            for i, q in enumerate(qs):
                query[i, : qlens[i]] = torch.from_numpy(s.query_tokens[q].astype(np.float32))
                qmask[i, : qlens[i]] = 1.0
            tp = torch.nn.functional.normalize(tool @ weight, dim=-1)
            qp = torch.nn.functional.normalize(query @ weight, dim=-1)
            sims = torch.einsum("bqd,uld->bqul", qp, tp).masked_fill(~tmask[None, None], -4.0)
            late = (sims.max(dim=-1).values * qmask[:, :, None]).sum(1) / qmask.sum(1, keepdim=True)  # (B, U)
            loss = torch.zeros(())
            for i, q in enumerate(qs):
                idx = torch.tensor([at[t] for t in sets[i]])
                logits = late[i, idx] / temperature
                if residual:
                    cols = torch.tensor(sets[i])
                    logits = (firsts[si][int(q), cols] + log_a.exp() * late[i, idx]) / temperature
                positive = torch.tensor([t in s.gold[q] for t in sets[i]])
                loss = loss + torch.logsumexp(logits, 0) - torch.logsumexp(logits[positive], 0)
            loss = loss / len(qs)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += loss.item()
            steps += 1
        log(f"  epoch {epoch + 1}/{epochs}: loss {total / max(steps, 1):.3f} over {steps} steps")
    return weight.detach().numpy().astype(np.float32)


# ---------------------------------------------------------------- the study


def groups_of(names: list[str], n_folds: int) -> list[tuple[list[str], list[str]]]:
    """(test, train) source lists; the MCP pair is one group (shared tools)."""
    key = {n: ("mcp" if n in MCP_GROUP else n) for n in names}
    sizes: dict[str, int] = {}
    for n in names:
        sizes[key[n]] = sizes.get(key[n], 0) + 1
    folds = loso_folds({k: 1 for k in sizes}, n_folds)
    out = []
    for fold in folds:
        test = [n for n in names if key[n] in fold.test]
        out.append((test, [n for n in names if n not in test]))
    return out


def choose_w(per_source: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], golds: dict[str, Any], train: list[str]) -> float:
    best_w, best = 0.0, -1.0
    for w in W_GRID:
        found = pooled([score_ranks(n, ranks_after(*per_source[n], w, golds[n])) for n in train])["found_at_1"]
        if found > best + 1e-12:
            best_w, best = w, found
    return best_w


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--cache", type=Path, default=Path("/tmp/late_cache"))
    parser.add_argument("--max-queries", type=int, default=120)
    parser.add_argument("--max-tools", type=int, default=300)
    parser.add_argument("--dims", type=int, nargs="*", default=[64], help="projection sizes (0 with --misses: raw states only)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--folds", type=int, default=6)
    parser.add_argument("--residual", action="store_true", help="train P with the first stage's score as an offset")
    parser.add_argument("--embed-only", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--cost-only", action="store_true", help="time the stages with the cached fold-0 projections")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--misses", action="store_true",
                        help="train on every source and rank the three known misses")
    parser.add_argument("--misses-w", type=float, default=None, help="with --misses: this w, not the one chosen on all sources")
    args = parser.parse_args()

    corpus = load_corpus(args.data, max_queries=args.max_queries, max_tools=args.max_tools,
                         extra=[MCP_SOURCE, NEW_MCP_TASKS])
    tuned_enc = TokenEncoder("tuned", True, args.cache)
    if args.cost_only:
        found = {d: sorted((args.cache / "projections").glob(f"d{d}-e{args.epochs}-fold0-*.npy")) for d in args.dims}
        print(json.dumps(cost(args, tuned_enc, {d: {"fold0": np.load(f[0])} for d, f in found.items() if f}), indent=2))
        return 0
    plain_enc = TokenEncoder("minilm", False, args.cache)
    order = sorted(range(len(corpus)), key=lambda i: len(corpus[i].tools) + len(corpus[i].queries))
    tuned: dict[str, SourceTokens] = {}
    plain: dict[str, np.ndarray] = {}
    for i in order:
        data = corpus[i]
        tuned[data.name] = source_tokens(data, tuned_enc, args.cache, shorthand=True)
        p = source_tokens(data, plain_enc, args.cache, shorthand=False)
        plain[data.name] = p.query_pooled @ p.tool_pooled.T + HYBRID_ALPHA * p.bm25
    if args.embed_only:
        return 0
    names = [d.name for d in corpus]
    if args.misses:
        for dim in args.dims:
            print(known_misses(args, [tuned[n] for n in names], tuned_enc, dim))
        return 0
    golds = {n: tuned[n].gold for n in names}
    s1 = {n: first_stage(tuned[n]) for n in names}
    cmax = max(CANDIDATES)
    cand = {n: top_candidates(s1[n], cmax) for n in names}
    rows: dict[str, dict[str, SourceScore]] = {
        "hybrid plain MiniLM": {n: score_ranks(n, plain_ranks(plain[n], golds[n])) for n in names},
        "shipped first stage (tuned hybrid)": {n: score_ranks(n, plain_ranks(s1[n], golds[n])) for n in names},
    }
    chosen: dict[str, dict[str, float]] = {}
    folds = groups_of(names, args.folds)
    # The untrained baseline: raw 384-d states (int8, as upload would store them).
    raw = {n: late_scores(tuned[n], cand[n], None) for n in names}
    log("raw384 MaxSim scored")
    for c in CANDIDATES:
        label = f"raw384 int8 MaxSim, top-{c}"
        rows[label], chosen[label] = {}, {}
        per = {n: (s1[n], cand[n][:, :c], raw[n][:, :c]) for n in names}
        for test, train in folds:
            w = choose_w(per, golds, train)
            for n in test:
                rows[label][n] = score_ranks(n, ranks_after(*per[n], w, golds[n]))
                chosen[label][n] = w
    projections: dict[int, dict[str, np.ndarray]] = {}
    variant = "-res" if args.residual else ""
    for dim in args.dims:
        late: dict[str, np.ndarray] = {}
        train_late: dict[int, dict[str, np.ndarray]] = {}
        for fi, (test, train) in enumerate(folds):
            log(f"dim {dim}, fold {fi + 1}/{len(folds)}: held out {', '.join(test)}")
            path = args.cache / "projections" / f"d{dim}-e{args.epochs}{variant}-fold{fi}-{'+'.join(test)}.npy"
            if path.is_file():
                proj = np.load(path)
            else:
                proj = train_projection([tuned[n] for n in train], dim, epochs=args.epochs, seed=fi,
                                        residual=args.residual)
                path.parent.mkdir(parents=True, exist_ok=True)
                np.save(path, proj)
            projections.setdefault(dim, {})[f"fold{fi}"] = proj
            train_late[fi] = {n: late_scores(tuned[n], cand[n], proj) for n in names}
            for n in test:
                late[n] = train_late[fi][n]
        for c in CANDIDATES:
            label = f"late d{dim}{variant} int8, top-{c}"
            rows[label], chosen[label] = {}, {}
            for fi, (test, train) in enumerate(folds):
                per = {n: (s1[n], cand[n][:, :c], train_late[fi][n][:, :c]) for n in names}
                w = choose_w(per, golds, train)
                for n in test:
                    rows[label][n] = score_ranks(n, ranks_after(*per[n], w, golds[n]))
                    chosen[label][n] = w
            # The fold's P scores its own training sources too well (it was trained on them), which
            # pushes w up; cross-fitted: w is chosen on each training source's held-out scores.
            label = f"late d{dim}{variant} int8, top-{c}, w cross-fitted"
            rows[label], chosen[label] = {}, {}
            held = {n: (s1[n], cand[n][:, :c], late[n][:, :c]) for n in names}
            for fi, (test, train) in enumerate(folds):
                w = choose_w(held, golds, train)
                for n in test:
                    rows[label][n] = score_ranks(n, ranks_after(s1[n], cand[n][:, :c], train_late[fi][n][:, :c], w, golds[n]))
                    chosen[label][n] = w
        label = f"late d{dim}{variant} alone, top-{cmax}"
        rows[label] = {n: score_ranks(n, ranks_after(s1[n], cand[n], late[n] * 1e6, 1.0, golds[n])) for n in names}
    report = summarise(rows, names, {n for n in names if tuned[n].multi.mean() >= MULTI_TOOL_SHARE})
    print(format_report(report, names, chosen))
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": report, "chosen_w": chosen}
    if not args.skip_cost:
        result["cost"] = cost(args, tuned_enc, projections)
        print(json.dumps(result["cost"], indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


SIXTEEN_EXCLUDES = MCP_GROUP


def summarise(rows: dict[str, dict[str, SourceScore]], names: list[str], multi: set[str]) -> dict[str, Any]:
    base = rows["hybrid plain MiniLM"]
    first = rows["shipped first stage (tuned hybrid)"]
    sixteen = [n for n in names if n not in SIXTEEN_EXCLUDES]
    out: dict[str, Any] = {}
    for label, by in rows.items():
        entry: dict[str, Any] = {}
        for scope, members in (("16 sources", sixteen), ("MCP sources", list(MCP_GROUP))):
            ms = [n for n in members if n in multi]
            f = pooled([by[n] for n in members])["found_at_1"]
            entry[scope] = {
                "found_at_1": 100 * f,
                "vs_plain": 100 * (f - pooled([base[n] for n in members])["found_at_1"]),
                "vs_first_stage": 100 * (f - pooled([first[n] for n in members])["found_at_1"]),
                "recall_at_5_multi": 100 * pooled([by[n] for n in ms])["recall_at_5_multi"] if ms else float("nan"),
                "recall_vs_plain": 100 * (pooled([by[n] for n in ms])["recall_at_5_multi"]
                                          - pooled([base[n] for n in ms])["recall_at_5_multi"]) if ms else float("nan"),
            }
        entry["per_source_found_at_1"] = {n: 100 * by[n].found_at_1 for n in names}
        entry["per_source_recall_at_5"] = {n: 100 * by[n].recall_at_5_multi for n in names if n in multi}
        out[label] = entry
    return out


def format_report(report: dict[str, Any], names: list[str], chosen: dict[str, dict[str, float]]) -> str:
    first = report["shipped first stage (tuned hybrid)"]["per_source_found_at_1"]
    lines = ["| ranking | found@1, 16 sources | vs plain | vs first stage | recall@5 multi | vs plain "
             "| worst source vs first stage | MCP found@1 (vs first stage) |", "|---" * 8 + "|"]
    for label, r in report.items():
        s, m = r["16 sources"], r["MCP sources"]
        worst = min(((n, r["per_source_found_at_1"][n] - first[n]) for n in names), key=lambda kv: kv[1])
        lines.append(f"| {label} | {s['found_at_1']:.1f} | {s['vs_plain']:+.1f} | {s['vs_first_stage']:+.1f} "
                     f"| {s['recall_at_5_multi']:.1f} | {s['recall_vs_plain']:+.1f} | {worst[0]} {worst[1]:+.1f} "
                     f"| {m['found_at_1']:.1f} ({m['vs_first_stage']:+.1f}) |")
    lines += ["", "per source, found@1:", "| source | " + " | ".join(report) + " |", "|---|" + "---|" * len(report)]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(f"{r['per_source_found_at_1'][n]:.1f}" for r in report.values()) + " |")
    lines += ["", "per multi-tool source, recall@5:", "| source | " + " | ".join(report) + " |",
              "|---|" + "---|" * len(report)]
    for n in report["hybrid plain MiniLM"]["per_source_recall_at_5"]:
        lines.append(f"| {n} | " + " | ".join(f"{r['per_source_recall_at_5'][n]:.1f}" for r in report.values()) + " |")
    lines += ["", f"w chosen on the training folds: {json.dumps(chosen)}"]
    return "\n".join(lines)


def cost(args: argparse.Namespace, encoder: TokenEncoder, projections: dict[int, dict[str, np.ndarray]]) -> dict[str, Any]:
    """Per request on one thread: the default first stage at N=500, and the rerank of its top C."""
    import onnxruntime as ort

    from registry.index.minilm_graph import build_sentence_encoder, load_weights

    data = load_corpus(args.data, only=["toolbench_stable"], max_queries=200, max_tools=500)[0]
    texts = tool_texts(data.tools)[:500]
    queries = [expand_shorthand(q.query) for q in data.queries][:200]
    config, weights = load_weights(minilm_model_dir(), ROOT / "models" / "tuned-embedder" / DELTA_FILE)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_cpu_mem_arena = False
    default = ort.InferenceSession(build_sentence_encoder(config, weights).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    both = ort.InferenceSession(build_sentence_encoder(config, weights, token_output=TOKEN_OUTPUT).SerializeToString(),
                                options, providers=["CPUExecutionProvider"])
    tool_pooled, tool_tok = encoder.encode(texts)
    lexical = LexicalIndex(texts)
    out: dict[str, Any] = {"n_tools": len(texts), "queries": len(queries),
                           "mean_tool_tokens": float(np.mean([len(t) for t in tool_tok]))}

    def feeds(text: str) -> dict[str, np.ndarray]:
        enc = encoder.tokenizer.encode(text)
        ids = np.asarray([enc.ids], np.int64)
        return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}

    def hybrid(vector: np.ndarray, text: str) -> np.ndarray:
        tokens = tokenize(text)
        ceiling = lexical.ceiling(tokens)
        s = tool_pooled @ vector
        return s + (HYBRID_ALPHA / ceiling) * lexical.scores(tokens) if ceiling > 0 else s

    timings: dict[str, list[float]] = {"first stage, default graph": [], "first stage, graph with token output": []}
    stores: dict[str, tuple[np.ndarray | None, list[tuple[np.ndarray, np.ndarray]]]] = {
        "raw384": (None, [quantise(t, None) for t in tool_tok])
    }
    for dim, projs in projections.items():
        proj = next(iter(projs.values()))
        stores[f"d{dim}"] = (proj, [quantise(t, proj) for t in tool_tok])
    for label, (_, store) in stores.items():
        bytes_per_tool = np.mean([q.nbytes + s.nbytes for q, s in store])
        out[f"{label} bytes per tool (int8 + fp16 scale per token)"] = float(bytes_per_tool)
        for c in CANDIDATES:
            timings[f"rerank top-{c}, {label}"] = []
    for text in queries:
        f = feeds(text)
        t0 = time.perf_counter()
        (vec,) = default.run(["sentence_embedding"], f)
        np.argsort(-hybrid(vec[0], text))[:30]
        timings["first stage, default graph"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        vec, states = both.run(None, f)
        top = np.argsort(-hybrid(vec[0], text))[:30]
        timings["first stage, graph with token output"].append(time.perf_counter() - t0)
        s1 = hybrid(vec[0], text)
        for label, (proj, store) in stores.items():
            for c in CANDIDATES:
                t0 = time.perf_counter()
                q = query_side(states[0], proj)
                late = maxsim_many(q, [store[int(t)] for t in top[:c]])
                top[:c][np.argsort(-(s1[top[:c]] + late), kind="stable")]
                timings[f"rerank top-{c}, {label}"].append(time.perf_counter() - t0)
    for key, values in timings.items():
        out[f"{key}: p50 ms"] = 1000 * float(np.median(values))
    return out


def known_misses(args: argparse.Namespace, sources: list[SourceTokens], encoder: TokenEncoder, dim: int) -> str:
    """The needed tool's rank on three requests of real registries, first stage and reranked (top 30),
    with ``P`` trained on every source and ``w`` chosen on every source."""
    if dim == 0:  # the untrained raw states alone
        return _misses(sources, encoder, None, "raw384")
    path = args.cache / "projections" / f"d{dim}-e{args.epochs}{'-res' if args.residual else ''}-all.npy"
    if path.is_file():
        proj = np.load(path)
    else:
        proj = train_projection(sources, dim, epochs=args.epochs, seed=99, residual=args.residual)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, proj)
    out = [_misses(sources, encoder, proj, f"d{dim}", args.misses_w), _misses(sources, encoder, None, "raw384", args.misses_w)]
    return "\n\n".join(out)


def _misses(
    sources: list[SourceTokens], encoder: TokenEncoder, proj: np.ndarray | None, label: str, fixed_w: float | None = None
) -> str:
    cmax = max(CANDIDATES)
    per = {}
    for s in sources:
        s1 = first_stage(s)
        cand = top_candidates(s1, cmax)
        per[s.name] = (s1, cand, late_scores(s, cand, proj))
    w = choose_w(per, {s.name: s.gold for s in sources}, [s.name for s in sources]) if fixed_w is None else fixed_w
    lines = [f"{label}: w = {w:g} ({'chosen on all sources' if fixed_w is None else 'given'})", "| request | needed | first stage rank | reranked rank | reranked top 5 |",
             "|---|---|---|---|---|"]
    for registry, request, needed in NAMED_MISSES:
        payload = json.loads((ROOT / registry).read_text())
        tools = parse_tools({"tools": payload["tools"]})
        texts = tool_texts(tools)
        text = expand_shorthand(request)
        tool_pooled, tool_tok = encoder.encode(texts)
        q_pooled, q_tok = encoder.encode([text])
        st = SourceTokens(registry, tool_pooled, tool_tok, q_pooled, q_tok, bm25_matrix(texts, [text]),
                          ((next(i for i, t in enumerate(tools) if t.name == needed),),))
        s1 = first_stage(st)
        cand = top_candidates(s1, cmax)
        late = late_scores(st, cand, proj)
        before = int(plain_ranks(s1, st.gold)[0][0]) + 1
        after = int(ranks_after(s1, cand, late, w, st.gold)[0][0]) + 1
        fused = s1[0, cand[0]] + w * late[0]
        top = [tools[int(t)].name for t in cand[0][np.argsort(-fused, kind="stable")][:5]]
        lines.append(f"| {request} | {needed} | {before} of {len(tools)} | {after} | {', '.join(top)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
