"""``shortlist train-embedder``: the 'tuned' embedder's artifact, LOSO figures first.

Default: fine-tune the MiniLM transformer (:mod:`registry.offline.finetune`, LOSO through
:mod:`registry.offline.finetune_loso` with ``--folds``, or figures of an earlier
``bench/studies/ranking_loso.py --finetune`` run with ``--loso-json``), then train on every source and
write ``<out>/encoder-delta.safetensors`` + ``manifest.json``. ``--adapter``: the linear adapter
on frozen MiniLM instead. Both steps load the corpus (:mod:`registry.offline.corpus`,
subsampled) and its plain-MiniLM vectors (cached, :mod:`registry.offline.corpus_vectors`). The
adapter path: grouped LOSO folds against today's hybrid MiniLM (``alpha`` =
:data:`registry.index.hybrid.HYBRID_ALPHA`), fit on every source, write ``<out>/adapter.npy`` +
``manifest.json``. The serving process composes either into ONNX at first start
(``SHORTLIST_EMBEDDER=tuned`` or ``tuned-int8``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from registry.fsio import atomic_write_bytes
from registry.index.minilm_export import ADAPTER_MANIFEST, TRAIN_EMBEDDER_COMMAND
from registry.offline.adapter import AdapterRecipe, fit_adapter
from registry.offline.corpus import DEFAULT_DATA_ROOT, MCP_SOURCE, load_corpus, loso_folds
from registry.offline.corpus_vectors import SourceVectors, corpus_vectors
from registry.offline.loso_report import loso_report
from registry.offline.ranking import FoldResult, best_alpha, run_loso

ADAPTER_FILE = "adapter.npy"
TUNED_MODEL_NAME = "all-MiniLM-L6-v2+tool-adapter"


def loso_table(
    sources: Sequence[SourceVectors], results: Sequence[FoldResult]
) -> tuple[str, dict[str, Any]]:
    """Markdown table (per source and pooled: baseline vs tuned) and the same figures as JSON."""
    tuned = {score.source: score for result in results for score in result.scores}
    alpha = {score.source: result.alpha for result in results for score in result.scores}
    table, figures = loso_report(sources, tuned, alpha)
    figures["folds"] = [list(r.fold.test) for r in results]  # last, where earlier manifests have it
    return table, figures


def write_adapter(
    out: Path, weight: np.ndarray, manifest: dict[str, Any], card: str | None = None
) -> Path:
    """Write ``adapter.npy`` then ``manifest.json`` (with its sha256) atomically under ``out``."""
    import io

    out.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.save(buffer, weight.astype(np.float32), allow_pickle=False)
    data = buffer.getvalue()
    atomic_write_bytes(out / ADAPTER_FILE, data)
    full = {
        "model": TUNED_MODEL_NAME,
        "file": ADAPTER_FILE,
        "sha256": hashlib.sha256(data).hexdigest(),
        "shape": list(weight.shape),
        **manifest,
    }
    atomic_write_bytes(out / ADAPTER_MANIFEST, (json.dumps(full, indent=2) + "\n").encode())
    if card is not None:
        atomic_write_bytes(out / "MODEL_CARD.md", card.encode())
    return out / ADAPTER_MANIFEST


def _provenance(
    args: argparse.Namespace, argv: Sequence[str] | None, base_model: str, sources: Sequence[Any]
) -> dict[str, Any]:
    """The manifest fields every trained embedder records: base, data, subsample and command."""
    return {
        "base_model": base_model,
        "datasets": {sv.name: {"queries": len(sv.gold), "tools": sv.tools.shape[0]} for sv in sources},
        "data_root": str(args.data),
        "subsample": {"max_queries": args.max_queries, "max_tools": args.max_tools, "seed": args.seed},
        "command": " ".join([TRAIN_EMBEDDER_COMMAND, *map(shlex.quote, argv or sys.argv[1:])]),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=TRAIN_EMBEDDER_COMMAND,
        description="Train the tool adapter on the public corpus: LOSO figures, then the shipped "
        "model on all sources.",
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_ROOT, help="data root (train/ + dev sets)")
    parser.add_argument("--out", type=Path, default=None, help="adapter directory (default: settings)")
    parser.add_argument("--vectors-cache", type=Path, default=Path("data/corpus_vectors"))
    parser.add_argument("--embedder-cache", type=Path, default=None)
    parser.add_argument("--max-queries", type=int, default=400, help="per source")
    parser.add_argument("--max-tools", type=int, default=1000, help="per source")
    parser.add_argument("--folds", type=int, default=4, help="grouped LOSO folds (0: skip LOSO)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--finetune", action="store_true",
        help="fine-tune the MiniLM transformer (sentence-transformers MNRL): the default",
    )
    parser.add_argument(
        "--adapter", action="store_true",
        help="train the linear adapter on frozen MiniLM instead of the fine-tune",
    )
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: the recipe's)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: the recipe's)")
    parser.add_argument("--layers", type=int, default=None, help="top encoder layers fine-tuned (default: the recipe's)")
    parser.add_argument(
        "--curriculum", type=float, default=None,
        help="share of the first steps on single-tool requests only (default: the recipe's)",
    )
    parser.add_argument(
        "--extra", nargs="*", type=Path, default=[MCP_SOURCE],
        help="more source directories (default: the project's MCP tasks; none: --extra)",
    )
    parser.add_argument(
        "--loso-json", type=Path, default=None,
        help="with --folds 0: LOSO figures of an earlier bench/studies/ranking_loso.py --finetune run for the manifest",
    )
    return parser


def main(argv: Sequence[str] | None = None, log: Callable[[str], None] | None = None) -> int:
    args = build_parser().parse_args(argv)
    say = log or (lambda m: print(time.strftime("%H:%M:%S"), m, file=sys.stderr, flush=True))
    from registry.index.embedders import load_minilm
    from registry.settings import Settings

    settings = Settings()
    out = args.out or settings.tuned_embedder_dir
    if not args.adapter:
        return finetune_main(args, out, argv, say)
    embedder = load_minilm(args.embedder_cache or settings.resolved_embedder_cache())
    corpus = load_corpus(
        args.data, max_queries=args.max_queries, max_tools=args.max_tools, seed=args.seed, extra=args.extra
    )
    sources = corpus_vectors(corpus, embedder, args.vectors_cache, say)
    recipe = AdapterRecipe(steps=args.steps or AdapterRecipe().steps, seed=args.seed)
    figures: dict[str, Any] = {}
    if args.folds:
        folds = loso_folds({sv.name: len(sv.gold) for sv in sources}, args.folds)
        results = run_loso(sources, folds, recipe, tune_alpha=False, log=say)
        table, figures = loso_table(sources, results)
        print(table)
    fit = fit_adapter(sources, recipe, say)
    alpha = best_alpha(sources, fit.weight)
    manifest = {
        **_provenance(args, argv, embedder.model_id, sources),
        "recipe": recipe.as_dict(),
        "hybrid_alpha_on_all": alpha,
        "training_loss": fit.losses,
        "loso": figures,
    }
    path = write_adapter(out, fit.weight, manifest)
    say(f"wrote {path} (loss {fit.losses[0]:.3f} -> {fit.losses[-1]:.3f}, alpha on all {alpha})")
    return 0


def finetune_main(
    args: argparse.Namespace, out: Path, argv: Sequence[str] | None, say: Callable[[str], None]
) -> int:
    """LOSO figures of the fine-tune (or read from ``--loso-json``), then the one on all sources."""
    from dataclasses import replace

    from registry.index.embedders import load_minilm
    from registry.index.minilm_export import minilm_model_dir
    from registry.offline.finetune import (
        FinetuneRecipe,
        finetune,
        load_base,
        mine_triplets,
        write_finetuned,
    )
    from registry.offline.finetune_loso import run_finetune_loso
    from registry.offline.finetune_report import finetune_table
    from registry.settings import Settings

    recipe = FinetuneRecipe(seed=args.seed)
    recipe = replace(
        recipe,
        steps=args.steps or recipe.steps,
        lr=args.lr if args.lr is not None else recipe.lr,
        batch=args.batch if args.batch is not None else recipe.batch,
        trainable_layers=args.layers if args.layers is not None else recipe.trainable_layers,
        curriculum=args.curriculum if args.curriculum is not None else recipe.curriculum,
    )
    embedder = load_minilm(args.embedder_cache or Settings().resolved_embedder_cache())
    corpus = load_corpus(
        args.data, max_queries=args.max_queries, max_tools=args.max_tools, seed=args.seed, extra=args.extra
    )
    sources = corpus_vectors(corpus, embedder, args.vectors_cache, say)
    figures: dict[str, Any] = {}
    if args.folds:
        workdir = out.parent / f".{out.name}-loso"
        workdir.mkdir(parents=True, exist_ok=True)
        progress = workdir / "folds.jsonl"
        progress.unlink(missing_ok=True)
        folds = loso_folds({sv.name: len(sv.gold) for sv in sources}, args.folds)
        run_finetune_loso(corpus, sources, folds, recipe, workdir, progress=progress, log=say)
        table, figures = finetune_table(sources, progress)
        print(table)
    elif args.loso_json is not None:
        figures = json.loads(Path(args.loso_json).read_text(encoding="utf-8"))
    triplets = mine_triplets(corpus, sources, recipe)
    say(f"all sources: {len(triplets)} triplets")
    model = load_base(minilm_model_dir(), recipe)
    fit = finetune(model, triplets, recipe, say)
    manifest = {
        **_provenance(args, argv, embedder.model_id, sources),
        "recipe": recipe.as_dict(),
        "triplets": len(triplets),
        "training_loss": fit.losses,
        "training_seconds": round(fit.seconds),
        "loso": figures,
    }
    path = write_finetuned(out, fit.model, minilm_model_dir(), manifest)
    say(f"wrote {path} (loss {fit.losses[0]:.3f} -> {fit.losses[-1]:.3f}, {fit.seconds:.0f}s)")
    return 0
