"""``shortlist train``: the depth policy's command line (score tables or episode files in, an
exported ONNX policy with its manifest out); the training itself is :mod:`registry.offline.train`.

    shortlist train --data DIR [DIR ...] --scorer hybrid --seed 0 --ensemble 3 --out models/mine
    python -m registry.offline.train_cli --episodes a.npz b.npz --holdout-fraction 0.3 --out models/
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from registry.fsio import json_safe
from registry.index.embed import sha256_file
from registry.index.hybrid import SCORERS
from registry.offline.carve import ANCHOR_SIZES, FILL_KINDS, SIZE_RANGE, carve_training, load_source
from registry.offline.cli_support import HelpFormatter, ProgressEmbedder, plain, progress_step
from registry.offline.env import (
    DEFAULT_GAMMA,
    DEFAULT_MAX_DEPTH,
    DEFAULT_STEP_COST,
    REWARD_FUNCTIONS,
)
from registry.offline.episodes import Episode, load_episodes
from registry.offline.metrics import DEFAULT_SCORER, compare_with_fixed
from registry.offline.model import SizeGatedQ, TrainedPolicy
from registry.offline.tables import load_or_build_table, rank_table
from registry.offline.train import data_episodes, holdout_rows, split_episodes, train_ensemble
from registry.settings import EMBEDDERS

log = logging.getLogger(__name__)

__all__ = ["main"]


def _load_episode_files(
    paths: Sequence[Path], holdout_fraction: float, seed: int
) -> tuple[list[Episode], dict[str, list[Episode]], list[Episode], list[dict[str, Any]], set[str]]:
    train_eps: list[Episode] = []
    hold_by_set: dict[str, list[Episode]] = {}
    all_eps: list[Episode] = []
    files_info = []
    scorers: set[str] = set()
    for path in paths:
        eps, meta = load_episodes(path)
        eps = [e for e in eps if e.n_gold > 0]
        tr, ho = split_episodes(eps, holdout_fraction, seed)
        train_eps += tr
        all_eps += eps
        hold_by_set[path.stem] = ho
        if "scorer" in meta:
            scorers.add(str(meta["scorer"]))
        files_info.append(
            {"path": str(path), "sha256": sha256_file(path), "n_episodes": len(eps), "meta": meta}
        )
    return train_eps, hold_by_set, all_eps, files_info, scorers


def _parse_sizes(values: Sequence[str]) -> list[int | str]:
    out: list[int | str] = []
    for v in values:
        if v == "full":
            out.append("full")
        else:
            n = int(v)
            if n < 2:
                raise SystemExit(f"--candidate-sizes: {v!r} is not 'full' or an integer >= 2")
            out.append(n)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Train a DQN depth policy, report held-out metrics, export ``policy.onnx`` + manifest.

    Training data is either labelled data directories (``--data``: ranked here under
    ``--scorer``) or episode files from ``shortlist episodes`` (``--episodes``). A
    ``--holdout-fraction`` of each set's queries is held out and evaluated over the full
    registry (found rate, mean K, BoR, depth efficiency against fixed K).
    """
    ap = argparse.ArgumentParser(
        prog="shortlist train", description=plain(main.__doc__), formatter_class=HelpFormatter
    )
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", nargs="+", type=Path, help="data directories (tools.json + queries.jsonl)")
    source.add_argument("--episodes", nargs="+", type=Path, help="episode .npz files (shortlist episodes)")
    ap.add_argument(
        "--scorer", default=None, choices=SCORERS,
        help="scorer ranking --data (default hybrid, the service default); with --episodes only the "
        "name recorded in the manifest (default: from the episode files)",
    )
    ap.add_argument(
        "--max-queries", type=int, default=None, help="--data: sample this many queries per set (default: all)"
    )
    ap.add_argument(
        "--candidate-sizes", nargs="+", default=["full"],
        help="--data: train on candidate sets of these sizes (integers and/or 'full'), e.g. "
        "20 50 100 200 500 1000 full",
    )
    ap.add_argument("--hard-fraction", type=float, default=0.25, help="share of hard distractors in a candidate set")
    ap.add_argument(
        "--carve-per-query", type=int, default=0,
        help="--data: also train on this many sub-registries per query (registry/offline/carve.py: gold + "
        "random / same-group / nearest-neighbour fill, BM25 recomputed on the sub-corpus)",
    )
    ap.add_argument(
        "--carve-sizes", type=int, nargs="+", default=list(ANCHOR_SIZES),
        help="sizes of a query's first carves; further carves draw N log-uniformly from --carve-range",
    )
    ap.add_argument(
        "--carve-range", type=int, nargs=2, default=list(SIZE_RANGE), metavar=("LO", "HI"),
        help="sizes of further carves are drawn log-uniformly from [LO, HI]",
    )
    ap.add_argument(
        "--size-gate", type=int, nargs=2, default=None, metavar=("N_LO", "N_HI"),
        help="with --carve-per-query: also train a large-registry expert on the full registries alone "
        "(plain BoR reward) and serve it from N_HI tools on, the carved-trained expert up to N_LO, "
        "blended between (SizeGatedQ; default: no gate)",
    )
    ap.add_argument("--embedder-cache", type=Path, default=None, help="MiniLM ONNX cache (default: the service's)")
    ap.add_argument(
        "--embedder", choices=EMBEDDERS, default=None,
        help="embedder whose scores the policy learns (default: SHORTLIST_EMBEDDER, else tuned); "
        "serve the policy with the same one",
    )
    ap.add_argument(
        "--fold-embedders", type=Path, default=None,
        help="score each --data set with the fine-tune of bench/studies/ranking_loso.py --finetune --workdir "
        "DIR whose fold held it out: the tuned model's scores on registries it never saw",
    )
    ap.add_argument("--table-cache", type=Path, default=None, help="cache score tables here (default: no cache)")
    ap.add_argument("--holdout-fraction", type=float, default=0.3, help="share of each data set's queries held out for the reported metrics")
    ap.add_argument("--seed", type=int, default=0, help="seeds the split, sampling and training")
    ap.add_argument("--ensemble", type=int, default=1, help="average the Q-values of this many seeds (seed, seed+1, ...)")
    ap.add_argument("--out", type=Path, default=None, help="export directory (omit: no export)")
    ap.add_argument(
        "--reward", choices=sorted(REWARD_FUNCTIONS), default="bor",
        help="terminal reward: bor (Bits-over-Random, the paper's) or an ablation",
    )
    ap.add_argument(
        "--reward-min-n", type=int, default=1,
        help="bor: price depth as on a registry of at least this many tools (registry.offline.env."
        "bor_reward_floor; matters for carved sub-registries only)",
    )
    ap.add_argument("--step-cost", type=float, default=DEFAULT_STEP_COST, help="cost of each CONTINUE (bits)")
    ap.add_argument("--gamma", type=float, default=DEFAULT_GAMMA, help="discount factor")
    ap.add_argument("--max-depth", type=int, default=DEFAULT_MAX_DEPTH, help="depth cap D of the MDP and the policy")
    ap.add_argument("--eval-cap", type=int, default=None, help="max_k for held-out metrics (default --max-depth)")
    ap.add_argument("--steps", type=int, default=4000, help="gradient steps per seed")
    ap.add_argument("--batch-size", type=int, default=512, help="states per minibatch")
    ap.add_argument("--hidden", type=int, nargs="+", default=[32, 32], help="hidden layer widths")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (cosine-decayed)")
    ap.add_argument(
        "--refit-all",
        action="store_true",
        help="after reporting held-out metrics, retrain on all queries and export that policy",
    )
    args = ap.parse_args(argv)
    if args.ensemble < 1:
        raise SystemExit("--ensemble must be >= 1")
    # One thread: the nets are tiny, and float reductions then do not depend on the core count,
    # so a seed reproduces the same policy on any machine (DQN amplifies rounding differences).
    torch.set_num_threads(1)
    cap = args.eval_cap or args.max_depth

    files_info: list[dict[str, Any]] = []
    carve_train: list[Episode] = []
    carve_all: list[Episode] = []
    if args.episodes:
        train_eps, hold_by_set, all_eps, files_info, scorers = _load_episode_files(
            args.episodes, args.holdout_fraction, args.seed
        )
        scorer = args.scorer or (",".join(sorted(scorers)) if scorers else "unknown")
        sizes: list[int | str] = ["full"]
    else:

        scorer = args.scorer or DEFAULT_SCORER
        sizes = _parse_sizes(args.candidate_sizes)
        embedder = None
        if scorer != "bm25" and args.fold_embedders is None:
            from registry.index.embedders import default_embedder
            from registry.settings import Settings

            chosen = {"embedder": args.embedder, "embedder_cache_dir": args.embedder_cache}
            settings = Settings(**{k: v for k, v in chosen.items() if v is not None})
            with progress_step(log, f"loading the {settings.embedder} embedder (exported to ONNX on first use)"):
                embedder = ProgressEmbedder(default_embedder(settings), log)
        tables = []
        train_rows, hold_rows, all_rows = [], [], []
        for directory in _progress(args.data, "scoring data sets"):
            if args.fold_embedders is not None and scorer != "bm25":
                from registry.offline.finetune_loso import held_out_embedder

                try:  # the scores a registry the tuned model never saw gets
                    embedder = ProgressEmbedder(held_out_embedder(args.fold_embedders, directory.name), log)
                except FileNotFoundError as exc:
                    raise SystemExit(str(exc)) from exc
            table = load_or_build_table(
                directory, embedder, cache_dir=args.table_cache, max_queries=args.max_queries,
                seed=args.seed, progress=True,
            )
            tr_rows, ho_rows = holdout_rows(table, args.holdout_fraction, args.seed)
            tables.append(table)
            hold_rows.append(ho_rows)
            train_rows.append(tr_rows)
            all_rows.append(sorted(tr_rows + ho_rows))
            files_info.append({"path": str(directory), "n_queries": len(all_rows[-1]), "meta": table.meta})
            if args.carve_per_query > 0:
                if scorer != "hybrid":
                    raise SystemExit("--carve-per-query needs --scorer hybrid")
                src = load_source(table, embedder, cache_dir=args.table_cache, seed=args.seed)
                carve = {"seed": args.seed, "anchors": args.carve_sizes, "size_range": tuple(args.carve_range)}
                with progress_step(log, f"carving sub-registries of {directory.name}"):
                    carve_train += carve_training(src, tr_rows, args.carve_per_query, **carve)
                    if args.refit_all:
                        carve_all += carve_training(src, all_rows[-1], args.carve_per_query, **carve)
        with progress_step(log, "building training episodes"):
            train_eps = data_episodes(
                tables, train_rows, scorer, sizes, hard_fraction=args.hard_fraction, seed=args.seed
            )
            all_eps = data_episodes(
                tables, all_rows, scorer, sizes, hard_fraction=args.hard_fraction, seed=args.seed
            )
        train_eps += carve_train
        all_eps += carve_all
        hold_by_set = {
            t.name: rank_table(t, scorer, rows=r).exact for t, r in zip(tables, hold_rows) if r
        }

    hp = dict(
        reward=args.reward,
        reward_min_n=args.reward_min_n,
        step_cost=args.step_cost,
        gamma=args.gamma,
        max_depth=args.max_depth,
        steps=args.steps,
        batch_size=args.batch_size,
        hidden=tuple(args.hidden),
        lr=args.lr,
    )
    seeds = list(range(args.seed, args.seed + args.ensemble))
    if args.size_gate and args.carve_per_query <= 0:
        raise SystemExit("--size-gate needs --carve-per-query")

    def fit(eps: list[Episode], n_carved: int, **log: Any) -> TrainedPolicy:
        small = train_ensemble(eps, seeds, **log, **hp)
        if not args.size_gate:
            return small
        large = train_ensemble(eps[: len(eps) - n_carved], seeds, **log, **{**hp, "reward_min_n": 1})
        config = dict(small.config, size_gate=list(args.size_gate), large_expert=large.config)
        return TrainedPolicy(network=SizeGatedQ(small.network, large.network, *args.size_gate), config=config)

    trained = fit(train_eps, len(carve_train), log_every=1000)
    metrics: dict[str, Any] = {}
    hold_all: list[Episode] = []
    with progress_step(log, "held-out metrics"):
        for stem, ho in hold_by_set.items():
            if ho:
                metrics[stem] = compare_with_fixed(trained.choose_depth, ho, cap)
                hold_all += ho
        if hold_all and len(hold_by_set) > 1:
            metrics["all"] = compare_with_fixed(trained.choose_depth, hold_all, cap)
    metrics = {
        "holdout": json_safe(metrics, 6),
        "eval_cap": cap,
        "trained_on": "all" if args.refit_all or args.holdout_fraction == 0 else "train_split",
    }
    print(json.dumps(metrics, indent=2))

    if args.out is not None:
        from registry.offline.export import export_onnx

        if args.refit_all:
            log.info("refitting on all %d episodes", len(all_eps))
            trained = fit(all_eps, len(carve_all), log_every=1000)
        training_data = {
            "files": files_info,
            "scorer": scorer,
            "candidate_sizes": sizes,
            "hard_fraction": args.hard_fraction if sizes != ["full"] else None,
            "carved": (
                {"per_query": args.carve_per_query, "anchor_sizes": args.carve_sizes,
                 "size_range": args.carve_range, "fills": list(FILL_KINDS),
                 "n_episodes": len(carve_all if args.refit_all else carve_train)}
                if args.carve_per_query > 0 and not args.episodes else None
            ),
            "holdout_fraction": args.holdout_fraction,
            "n_train": len(all_eps) if args.refit_all else len(train_eps),
            "n_holdout": len(hold_all),
            "hyperparameters": trained.config,
        }
        path = export_onnx(
            trained, args.out, training_data=training_data, metrics=metrics, seed=args.seed, scorer=scorer
        )
        print(f"exported {path}", file=sys.stderr)
    return 0


def _progress(items: Sequence[Any], desc: str) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm ships with the train extra
        return items
    return tqdm(items, desc=desc, unit="set", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
