"""LOSO ranking table: today's hybrid MiniLM against the tool adapter, per source and pooled.

Each grouped fold fits the adapter on the other sources (plain MiniLM vectors cached under
--vectors-cache) and scores the held-out ones: the public sources in --folds grouped folds, then
each --extra source (by default the project's MCP tasks) held out alone. The baseline (hybrid
MiniLM, alpha 0.8) is scored in the same run on the same queries. found@1 over all queries, recall@5 over the
multi-tool queries of the multi-tool sources (>= 10% multi-tool queries).

    python bench/studies/ranking_loso.py --data ../shared/data [--folds 4] [--steps 300] [--pull 0.01]

With ``--finetune`` each fold fine-tunes the MiniLM transformer instead (registry.offline.
finetune_loso: MNRL with same-registry hard negatives, scored through the fold's ONNX fp32 and
int8 exports at the alpha picked on its train sources and at today's 0.8); trained folds in
--workdir are reused, so a cut-short run resumes:

    python bench/studies/ranking_loso.py --data ../shared/data --finetune --steps 36 --batch 32 --lr 1e-4 \
        --workdir data/finetune_loso --json data/finetune_loso/loso.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from registry.index.embed import Embedder
from registry.index.embedders import load_minilm
from registry.index.hybrid import HYBRID_ALPHA
from registry.offline.adapter import AdapterRecipe
from registry.offline.corpus import DEFAULT_DATA_ROOT, MCP_SOURCE, Fold, load_corpus, loso_folds
from registry.offline.corpus_vectors import corpus_vectors
from registry.offline.finetune import FinetuneRecipe
from registry.offline.finetune_loso import run_finetune_loso
from registry.offline.finetune_report import finetune_table
from registry.offline.ranking import run_loso
from registry.offline.train_embedder import loso_table
from registry.settings import Settings


def bench_folds(sources: list, args: argparse.Namespace) -> list[Fold]:
    """The public sources' grouped folds (trained on public sources only, so a fold is the same
    with or without --extra), then one fold per --extra source trained on every public source;
    --fold-index keeps just those folds (0-based, in that order)."""
    extra = set() if args.group_extra else {Path(p).name for p in args.extra}
    public = tuple(sv.name for sv in sources if sv.name not in extra)
    folds = loso_folds({sv.name: len(sv.gold) for sv in sources if sv.name in public}, args.folds)
    folds += [Fold(test=(sv.name,), train=public) for sv in sources if sv.name in extra]
    return folds if args.fold_index is None else [folds[i] for i in args.fold_index]


def finetune_main(
    args: argparse.Namespace, corpus: list, sources: list, minilm: Embedder, log: Callable[[str], None]
) -> int:
    recipe = replace(
        FinetuneRecipe(), steps=args.steps, batch=args.batch, lr=args.lr, trainable_layers=args.layers,
        curriculum=args.curriculum, max_seq_length=args.max_seq_length,
    )
    training = None
    if args.train_max_queries:  # mine triplets from a larger subsample of the same sources
        more = load_corpus(
            args.data, max_queries=args.train_max_queries, max_tools=args.max_tools, only=args.only,
            extra=args.extra,
        )
        training = (more, corpus_vectors(more, minilm, args.vectors_cache, log))
    folds = bench_folds(sources, args)
    args.workdir.mkdir(parents=True, exist_ok=True)
    progress = args.workdir / "folds.jsonl"
    progress.unlink(missing_ok=True)  # folds already trained in --workdir are reused
    log(f"recipe {recipe.as_dict()}, folds {[list(f.test) for f in folds]}")
    run_finetune_loso(
        corpus, sources, folds, recipe, args.workdir, progress=progress, log=log, training=training
    )
    table, figures = finetune_table(sources, progress)
    fixed_table, fixed = finetune_table(sources, progress, fixed_alpha=True)
    print(f"recipe {recipe.as_dict()}, folds {[list(f.test) for f in folds]}")
    print("alpha picked on each fold's train sources:")
    print(table)
    print(f"\nalpha fixed at today's {HYBRID_ALPHA}:")
    print(fixed_table)
    if args.json:
        out = {"recipe": recipe.as_dict(), "tuned_alpha": figures, "fixed_alpha": fixed}
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--vectors-cache", type=Path, default=Path("data/corpus_vectors"))
    parser.add_argument("--embedder-cache", type=Path, default=None)
    parser.add_argument("--max-queries", type=int, default=400)
    parser.add_argument("--max-tools", type=int, default=1000)
    parser.add_argument("--folds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=AdapterRecipe().steps)
    parser.add_argument("--lr", type=float, default=AdapterRecipe().lr)
    parser.add_argument("--pull", type=float, default=AdapterRecipe().identity_pull)
    parser.add_argument("--tune-alpha", action="store_true", help="pick alpha on each fold's train sources")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--finetune", action="store_true", help="fine-tune MiniLM per fold instead")
    parser.add_argument("--batch", type=int, default=FinetuneRecipe().batch)
    parser.add_argument("--layers", type=int, default=FinetuneRecipe().trainable_layers,
                        help="top encoder layers fine-tuned")
    parser.add_argument("--workdir", type=Path, default=Path("data/finetune_loso"))
    parser.add_argument("--max-seq-length", type=int, default=FinetuneRecipe().max_seq_length,
                        help="tokens per text in training (the service embeds up to 256)")
    parser.add_argument("--curriculum", type=float, default=FinetuneRecipe().curriculum,
                        help="share of the first steps on single-tool requests only")
    parser.add_argument("--train-max-queries", type=int, default=None,
                        help="mine triplets from this many queries per source (default: --max-queries)")
    parser.add_argument("--group-extra", action="store_true",
                        help="put the --extra sources in the grouped folds (trained on when not held out)")
    parser.add_argument("--only", nargs="*", default=None, help="just these sources")
    parser.add_argument("--extra", nargs="*", type=Path, default=[MCP_SOURCE],
                        help="more source directories (default: the project's MCP tasks; none: --extra)")
    parser.add_argument("--fold-index", nargs="*", type=int, default=None,
                        help="run just these folds (0-based)")
    args = parser.parse_args()

    def log(message: str) -> None:
        print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)

    embedder = load_minilm(args.embedder_cache or Settings().resolved_embedder_cache())
    corpus = load_corpus(
        args.data, max_queries=args.max_queries, max_tools=args.max_tools, only=args.only, extra=args.extra
    )
    sources = corpus_vectors(corpus, embedder, args.vectors_cache, log)
    if args.finetune:
        return finetune_main(args, corpus, sources, embedder, log)
    recipe = replace(AdapterRecipe(), steps=args.steps, lr=args.lr, identity_pull=args.pull)
    folds = bench_folds(sources, args)
    results = run_loso(sources, folds, recipe, tune_alpha=args.tune_alpha, log=log)
    table, figures = loso_table(sources, results)
    print(f"recipe {recipe.as_dict()}, folds {[list(f.test) for f in folds]}")
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"recipe": recipe.as_dict(), **figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
