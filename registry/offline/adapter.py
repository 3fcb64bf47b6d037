"""A learned linear adapter on MiniLM embeddings, trained for tool retrieval (needs torch).

The tuned embedder is ``normalize(W @ minilm(text))`` for queries and tools alike, so one ONNX
graph (MiniLM, mean pooling, one extra MatMul, L2 norm) serves both and the hybrid keeps its
form; cosine becomes the learned bilinear form ``x_q' W'W x_t`` over MiniLM's space. ``W``
starts at the identity (the plain model) and is trained on cached embeddings (see
:mod:`registry.offline.corpus_vectors`), so a fit over the whole corpus takes minutes on CPU
where a fine-tune of the transformer takes hours.

Loss, per (query, gold tool) pair: softmax cross-entropy over the hybrid scores
``(cos + alpha * bm25) / tau`` of every tool of the query's own registry (the same-registry hard
negatives; the query's other gold tools are masked out) plus the batch's gold tools of the
other registries (in-batch negatives, cosine only). Training through the hybrid teaches the
dense part what BM25 misses, instead of re-learning what it already finds. An L2 pull of ``W``
towards the identity keeps the model near MiniLM where the corpus says nothing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from registry.offline.corpus_vectors import SourceVectors


@dataclass(frozen=True, slots=True)
class AdapterRecipe:
    """Hyper-parameters of :func:`fit_adapter` (recorded in the artifact's manifest)."""

    steps: int = 200
    batch: int = 64
    lr: float = 2e-3
    temperature: float = 0.05
    alpha: float = 0.8  # the hybrid's BM25 weight during training
    identity_pull: float = 0.1
    max_queries_per_source: int = 400  # a source's weight in the draw is capped here
    sources_per_step: int = 2
    seed: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class FitResult:
    weight: np.ndarray  # (dim, dim) float32: embedding' = normalize(weight @ embedding)
    losses: list[float]  # mean training loss per logged window
    seconds: float


def _pairs(sources: Sequence[SourceVectors], cap: int, rng: random.Random) -> list[list[tuple[int, int]]]:
    """Per source, its (query, gold row) pairs; a source with more than ``cap`` queries keeps ``cap``."""
    out = []
    for sv in sources:
        rows = list(range(len(sv.gold)))
        if len(rows) > cap:
            rows = rng.sample(rows, cap)
        out.append([(q, g) for q in rows for g in sv.gold[q]])
    return out


def fit_adapter(
    sources: Sequence[SourceVectors],
    recipe: AdapterRecipe = AdapterRecipe(),
    log: Callable[[str], None] = lambda _: None,
) -> FitResult:
    """Train ``W`` on ``sources`` (see the module docstring); deterministic for one recipe."""
    import torch

    # One thread: the matrices are small, and on a shared machine idle-spinning workers of a
    # larger pool cost more than they compute.
    torch.set_num_threads(1)
    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    pairs = _pairs(sources, recipe.max_queries_per_source, rng)
    live = [s for s, p in enumerate(pairs) if p]
    if not live:
        raise ValueError("no training pairs: every source is empty")
    draw_weights = [len(pairs[s]) for s in live]
    per_source = max(1, recipe.batch // recipe.sources_per_step)
    dim = sources[0].tools.shape[1]
    tools = [torch.from_numpy(np.ascontiguousarray(sv.tools)) for sv in sources]
    queries = [torch.from_numpy(np.ascontiguousarray(sv.queries)) for sv in sources]
    bm25 = [torch.from_numpy(np.ascontiguousarray(sv.bm25)) for sv in sources]
    delta = torch.zeros(dim, dim, requires_grad=True)
    eye = torch.eye(dim)
    optimiser = torch.optim.Adam([delta], lr=recipe.lr)
    losses: list[float] = []
    window: list[float] = []
    start = time.monotonic()
    every = max(1, recipe.steps // 10)
    for step in range(recipe.steps):
        # A few registries a step: each one's tools are mapped once, all of them negatives.
        picked = set(rng.choices(live, draw_weights, k=min(recipe.sources_per_step, len(live))))
        batch = [(s, *rng.choice(pairs[s])) for s in sorted(picked) for _ in range(per_source)]
        weight = eye + delta
        by_source: dict[int, list[tuple[int, int]]] = {}
        for s, q, g in batch:
            by_source.setdefault(s, []).append((q, g))
        gold_vectors = torch.nn.functional.normalize(
            torch.stack([tools[s][g] for s, _, g in batch]) @ weight.T, dim=1
        )
        batch_source = torch.tensor([s for s, _, _ in batch])
        total = torch.zeros(())
        for s, items in by_source.items():
            q_rows = torch.tensor([q for q, _ in items])
            g_rows = torch.tensor([g for _, g in items])
            q_vec = torch.nn.functional.normalize(queries[s][q_rows] @ weight.T, dim=1)
            t_vec = torch.nn.functional.normalize(tools[s] @ weight.T, dim=1)
            own = (q_vec @ t_vec.T + recipe.alpha * bm25[s][q_rows]) / recipe.temperature
            mask = torch.zeros_like(own, dtype=torch.bool)
            for i, (q, g) in enumerate(items):
                others = [x for x in sources[s].gold[q] if x != g]
                if others:
                    mask[i, others] = True
            own = own.masked_fill(mask, float("-inf"))
            foreign = (q_vec @ gold_vectors[batch_source != s].T) / recipe.temperature
            logits = torch.cat([own, foreign], dim=1)
            total = total + torch.nn.functional.cross_entropy(logits, g_rows, reduction="sum")
        loss = total / len(batch) + recipe.identity_pull * (delta**2).sum()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        window.append(float(loss.detach()))
        if (step + 1) % every == 0 or step + 1 == recipe.steps:
            losses.append(sum(window) / len(window))
            window = []
            log(f"step {step + 1}/{recipe.steps} loss {losses[-1]:.4f}")
    fitted = (eye + delta).detach().numpy().astype(np.float32)
    return FitResult(fitted, losses, time.monotonic() - start)


def apply_adapter(vectors: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
    """``normalize(weight @ v)`` per row; ``weight=None`` is the plain model."""
    if weight is None:
        return vectors
    out = vectors @ weight.T
    return (out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)).astype(np.float32)
