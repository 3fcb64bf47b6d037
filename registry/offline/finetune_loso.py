"""Leave-one-source-out runs of the MiniLM fine-tune, scored through its ONNX exports.

Per grouped fold (:func:`registry.offline.corpus.loso_folds`): mine triplets on the fold's train
sources, fine-tune (:mod:`registry.offline.finetune`), write the artifact, export it to ONNX fp32
and int8 exactly as the service does at first start, pick the hybrid ``alpha`` on a subsample of
the *train* sources (small registries, so a fold costs minutes, not an hour), and score the
held-out sources with both exports. The plain-MiniLM baseline comes from the cached corpus
vectors (:mod:`registry.offline.corpus_vectors`) on the same queries and tools.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from registry.index.embed import TOKENIZER_FILE, OnnxEmbedder
from registry.index.hybrid import HYBRID_ALPHA
from registry.index.minilm_export import minilm_model_dir
from registry.offline.corpus import Fold, subsample
from registry.offline.corpus_vectors import SourceVectors
from registry.offline.datasets import Dataset
from registry.offline.finetune import (
    FinetuneRecipe,
    finetune,
    load_base,
    mine_triplets,
    write_finetuned,
)
from registry.offline.ranking import ALPHA_GRID, SourceScore, best_alpha, score_source

ALPHA_MAX_TOOLS = 150  # train sources with at most this many tools pick alpha
ALPHA_MAX_QUERIES = 80  # per alpha source


@dataclass(frozen=True, slots=True)
class FinetuneFold:
    """Held-out scores at the ``alpha`` picked on the train sources and at today's fixed alpha."""

    fold: Fold
    alpha: float
    losses: list[float]
    seconds: float
    fp32: list[SourceScore]
    int8: list[SourceScore]
    fp32_fixed: list[SourceScore]
    int8_fixed: list[SourceScore]


def reembed(data: Dataset, base: SourceVectors, embedder: OnnxEmbedder) -> SourceVectors:
    """``base`` with its dense vectors replaced by ``embedder``'s (BM25 and gold unchanged)."""
    tools = embedder.embed_documents([t.text() for t in data.tools], batch_size=16)
    queries = embedder.embed_documents([q.query for q in data.queries], batch_size=32)
    return replace(base, tools=tools, queries=queries)


def alpha_subset(
    data: Sequence[Dataset], vectors: Sequence[SourceVectors], seed: int
) -> list[tuple[Dataset, SourceVectors]]:
    """Small train registries, at most :data:`ALPHA_MAX_QUERIES` queries each, to pick ``alpha``."""
    out = []
    for ds, sv in zip(data, vectors, strict=True):
        if len(ds.tools) > ALPHA_MAX_TOOLS:
            continue
        keep = subsample(list(range(len(ds.queries))), ALPHA_MAX_QUERIES, seed)
        ds_small = Dataset(ds.name, ds.tools, [ds.queries[i] for i in keep])
        sv_small = replace(sv, queries=sv.queries[keep], bm25=sv.bm25[keep], gold=tuple(sv.gold[i] for i in keep))
        out.append((ds_small, sv_small))
    return out


def export_pair(artifact: Path, out_dir: Path) -> tuple[Path, Path]:
    """ONNX fp32 and int8 of a fine-tune artifact (the service's export path, in-process)."""
    from registry.index.export_embedder import export_minilm_onnx, quantize_minilm_int8

    fp32 = export_minilm_onnx(minilm_model_dir(), out_dir / "model-tuned.onnx", adapter=artifact)
    int8 = quantize_minilm_int8(fp32, out_dir / "model-tuned-int8.onnx")
    return fp32, int8


def run_fold(
    fold: Fold,
    corpus: Sequence[Dataset],
    base: Sequence[SourceVectors],
    recipe: FinetuneRecipe,
    workdir: Path,
    log: Callable[[str], None],
    training: tuple[Sequence[Dataset], Sequence[SourceVectors]] | None = None,
) -> FinetuneFold:
    """Train (or reuse) one fold's model and score its held-out sources.

    ``training`` is another subsample of the same sources (more queries per source) to mine the
    triplets from; by default they come from ``corpus`` itself. Held-out sources are never
    trained on either way.
    """
    by_name = {ds.name: i for i, ds in enumerate(corpus)}
    train = [by_name[n] for n in fold.train]
    test = [by_name[n] for n in fold.test]
    start = time.monotonic()
    artifact = fold_dir(workdir, fold.test)
    state = artifact / "fold.json"
    done: dict[str, Any] = json.loads(state.read_text()) if state.is_file() else {}
    if not fold_onnx(artifact, int8=True).is_file():
        pool_data, pool_base = training if training is not None else (corpus, base)
        keep = [i for i, ds in enumerate(pool_data) if ds.name in fold.train]
        triplets = mine_triplets([pool_data[i] for i in keep], [pool_base[i] for i in keep], recipe)
        log(f"fold {fold.test}: {len(triplets)} triplets from {len(train)} sources")
        model = load_base(minilm_model_dir(), recipe)
        fit = finetune(model, triplets, recipe, log)
        meta = {"fold": list(fold.test), "recipe": recipe.as_dict(), "training_loss": fit.losses}
        write_finetuned(artifact, fit.model, minilm_model_dir(), meta)
        export_pair(artifact, artifact / "onnx")
        done = {"losses": fit.losses}
        state.write_text(json.dumps(done))
    else:
        log(f"fold {fold.test}: reusing the fine-tune in {artifact}")
    fp32_path, int8_path = fold_onnx(artifact), fold_onnx(artifact, int8=True)
    tokenizer = fp32_path.parent / TOKENIZER_FILE
    fp32 = OnnxEmbedder(fp32_path, tokenizer, threads=recipe.threads)
    if "alpha" not in done:
        small = alpha_subset([corpus[i] for i in train], [base[i] for i in train], recipe.seed)
        tuned_small = [reembed(ds, sv, fp32) for ds, sv in small]
        done["alpha"] = best_alpha(tuned_small, None, ALPHA_GRID) if tuned_small else recipe.hard_alpha
        log(f"fold {fold.test}: alpha {done['alpha']} on {[ds.name for ds, _ in small]}")
        state.write_text(json.dumps(done))
    alpha = float(done["alpha"])
    int8 = OnnxEmbedder(int8_path, tokenizer, threads=recipe.threads)
    scores: dict[str, list[SourceScore]] = {"fp32": [], "int8": [], "fp32_fixed": [], "int8_fixed": []}
    for i in test:
        for kind, embedder in (("fp32", fp32), ("int8", int8)):
            vectors = cached_reembed(corpus[i], base[i], embedder, vectors_file(artifact, corpus[i].name, kind))
            scores[kind].append(score_source(vectors, None, alpha))
            scores[f"{kind}_fixed"].append(score_source(vectors, None, HYBRID_ALPHA))
        log(
            f"  {corpus[i].name}: found@1 {base_found(base[i]):.3f} -> {scores['fp32'][-1].found_at_1:.3f} "
            f"at alpha {alpha}, {scores['fp32_fixed'][-1].found_at_1:.3f} at {HYBRID_ALPHA} "
            f"(int8 {scores['int8'][-1].found_at_1:.3f} / {scores['int8_fixed'][-1].found_at_1:.3f})"
        )
    return FinetuneFold(
        fold, alpha, list(done.get("losses", [])), time.monotonic() - start,
        scores["fp32"], scores["int8"], scores["fp32_fixed"], scores["int8_fixed"],
    )


def cached_reembed(data: Dataset, base: SourceVectors, embedder: OnnxEmbedder, path: Path) -> SourceVectors:
    """:func:`reembed`, kept in ``path`` so a rerun scores other alphas without embedding again."""
    import numpy as np

    if path.is_file():
        with np.load(path) as z:
            return replace(base, tools=z["tools"], queries=z["queries"])
    out = reembed(data, base, embedder)
    np.savez(path, tools=out.tools, queries=out.queries)
    return out


def vectors_file(artifact: Path, source: str, kind: str = "fp32") -> Path:
    """Where a fold keeps a held-out source's vectors from its ``kind`` export (fp32, int8)."""
    return artifact / f"{source}-{kind}.npz"


def held_out_vectors(workdir: Path, base: SourceVectors) -> SourceVectors | None:
    """``base`` with the fp32 dense vectors of the fold in ``workdir`` that held its source out,
    as that fold cached them while scoring it (:func:`cached_reembed`); None while no finished
    fold has them. BM25 and gold stay ``base``'s."""
    import numpy as np

    folds = sorted(p for p in workdir.iterdir() if p.is_dir()) if workdir.is_dir() else []
    for artifact in folds:
        path = vectors_file(artifact, base.name)
        if base.name in artifact.name.split("-") and path.is_file():
            with np.load(path) as z:
                return replace(base, tools=z["tools"], queries=z["queries"])
    return None


def base_found(sv: SourceVectors) -> float:
    return score_source(sv, None, HYBRID_ALPHA).found_at_1


def fold_dir(workdir: Path, test: Sequence[str]) -> Path:
    """Where a fold's fine-tune lives: ``<workdir>/<held-out sources joined by ->``."""
    return workdir / "-".join(test)


def fold_onnx(artifact: Path, *, int8: bool = False) -> Path:
    """A fold's exported model (its ``tokenizer.json`` sits beside it)."""
    return artifact / "onnx" / ("model-tuned-int8.onnx" if int8 else "model-tuned.onnx")


def held_out_embedder(workdir: Path, source: str, threads: int = 1) -> OnnxEmbedder:
    """The fp32 fine-tune in ``workdir`` whose fold held ``source`` out.

    Raises:
        FileNotFoundError: No trained fold in ``workdir`` held it out.
    """
    folds = sorted(workdir.iterdir()) if workdir.is_dir() else []
    for artifact in folds:
        onnx = fold_onnx(artifact)
        if source in artifact.name.split("-") and onnx.is_file():
            return OnnxEmbedder(onnx, onnx.parent / TOKENIZER_FILE, threads=threads)
    raise FileNotFoundError(f"no fold in {workdir} held {source} out (bench/studies/ranking_loso.py --finetune --workdir)")


def run_finetune_loso(
    corpus: Sequence[Dataset],
    base: Sequence[SourceVectors],
    folds: Sequence[Fold],
    recipe: FinetuneRecipe,
    workdir: Path,
    *,
    progress: Path | None = None,
    log: Callable[[str], None] = lambda _: None,
    training: tuple[Sequence[Dataset], Sequence[SourceVectors]] | None = None,
) -> list[FinetuneFold]:
    """Every fold in turn (see :func:`run_fold`); after each, its figures are appended to
    ``progress`` (JSON lines)."""
    out = []
    for fold in folds:
        result = run_fold(fold, corpus, base, recipe, workdir, log, training)
        out.append(result)
        if progress is not None:
            with open(progress, "a", encoding="utf-8") as f:
                f.write(json.dumps(fold_record(result)) + "\n")
    return out


def fold_record(result: FinetuneFold) -> dict[str, Any]:
    def scores(items: list[SourceScore]) -> list[dict[str, Any]]:
        return [
            {"source": s.source, "n_queries": s.n_queries, "found_at_1": s.found_at_1, "found_at_5": s.found_at_5,
             "n_multi": s.n_multi, "recall_at_5_multi": s.recall_at_5_multi}
            for s in items
        ]

    return {
        "test": list(result.fold.test),
        "alpha": result.alpha,
        "losses": result.losses,
        "seconds": result.seconds,
        "fp32": scores(result.fp32),
        "int8": scores(result.int8),
        "fp32_fixed": scores(result.fp32_fixed),
        "int8_fixed": scores(result.int8_fixed),
    }
