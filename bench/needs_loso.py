"""Needs-aware depth, leave-one-source-out: does a policy trained for EVERY needed tool beat
today's recipe and the fixed-K frontier on a source it never saw?

    nice -n 10 python bench/needs_loso.py --table-cache /tmp/i19d/tables --json out/needs_loso.json

Sources: the ten sets of ``../shared/data/train`` and the three dev sets (``--max-queries``
sampled per source, seed 0: a subsample, said in the output). Per source: the full-registry
hybrid ranking of each query, plus ``--carve-per-query`` carved sub-registries of 5-200 tools
(``registry/offline/carve.py``, as ``shortlist train --carve-per-query``) for training, and
evaluation carves of 5, 8, 16 and 24 tools (random / same-group / neighbour fill) of up to
``--carve-eval-queries`` queries.

For each held-out source S, on the other sources' episodes:

* **today's recipe** (schema 1: score features, any-found BoR, reward floor 1,024);
* **needs** (schema 2, :mod:`registry.serving.needs`: + the request's intents, length, joins,
  score profile and a learned needs estimate fitted on the training sources' gold counts;
  reward :class:`registry.offline.env.NeedsReward`, recall and all-needed chance-corrected);

then on S (cap 20 as served): any-found, recall, all-needed and mean K of each policy alone on
the full registry's ranking (no intent composition: ``bench/peers.py`` measures the engine),
the fixed-K frontier (best of hybrid, dense and BM25 top-K at the policy's mean K,
interpolated) and depth efficiency; on the small carves, found, mean K, efficiency and the
share of whole-registry answers. The shipped artifact (``--shipped``) is measured on the same
episodes for reference; it was trained on the three dev sets, so its rows there are in-sample.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry.offline.datasets import load_dataset  # noqa: E402
from registry.offline.episodes import Episode, load_episodes, save_episodes  # noqa: E402
from registry.serving.features import depth_features  # noqa: E402
from registry.serving.needs import NeedsModel, needs_inputs, request_signals  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
if not SHARED.is_dir():
    SHARED = Path("/work/shared/data")
DEV_SETS = ("bfcl_simple", "metatool", "toolbench_stable")
SCORER_NAMES = ("hybrid", "dense", "bm25")
EVAL_SIZES = (5, 8, 16, 24)
CAP = 20
MULTI_SHARE = 0.15  # a source with at least this share of multi-tool queries is "multi-tool"


def source_dirs() -> list[Path]:
    train = sorted(p for p in (SHARED / "train").iterdir() if (p / "tools.json").is_file())
    return train + [SHARED / name for name in DEV_SETS]


def _attach(episodes: Sequence[Episode], signals: dict[str, np.ndarray]) -> list[Episode]:
    for e in episodes:
        e.signals = signals.get(e.query_id.split("@", 1)[0])
    return [e for e in episodes if e.n_gold > 0]


def source_bundle(directory: Path, embedder: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Full-registry episodes per scorer, training carves and evaluation carves of one source
    (cached as episode files next to the score tables)."""
    from registry.offline.carve import carve_grid, carve_training, load_source
    from registry.offline.tables import load_or_build_table, rank_table

    cache = Path(args.table_cache) / "needs" / directory.name
    table = load_or_build_table(directory, embedder, cache_dir=args.table_cache, max_queries=args.max_queries, seed=0)
    texts = {q.id: q.query for q in load_dataset(directory).queries}
    signals = {qid: request_signals(texts.get(qid, "")) for qid in table.query_ids}
    rows = [i for i in range(table.n_queries) if table.gold[i].size]
    files = {name: cache / f"{name}.npz" for name in (*SCORER_NAMES, "carve_train", "carve_eval")}
    if not all(f.is_file() for f in files.values()):
        for scorer in SCORER_NAMES:
            save_episodes(files[scorer], rank_table(table, scorer).exact, {"scorer": scorer})
        src = load_source(table, embedder, cache_dir=args.table_cache, seed=0)
        save_episodes(files["carve_train"], carve_training(src, rows, args.carve_per_query, seed=0), {})
        eval_rows = rows[: args.carve_eval_queries]
        grid = carve_grid(src, eval_rows, [n for n in EVAL_SIZES if n < table.n_tools], seed=1)
        save_episodes(files["carve_eval"], [e for eps in grid.values() for e in eps], {})
    out: dict[str, Any] = {"name": directory.name, "n_tools": table.n_tools}
    for name, path in files.items():
        out[name] = _attach(load_episodes(path)[0], signals)
    full = out["hybrid"]
    out["multi_share"] = float(np.mean([e.n_gold > 1 for e in full])) if full else 0.0
    out["mean_gold"] = float(np.mean([e.n_gold for e in full])) if full else 0.0
    return out


# ----------------------------------------------------------------------------- metrics


def _hits(e: Episode, k: int) -> int:
    return int(np.count_nonzero(e.gold_ranks < k))


def outcome(episodes: Sequence[Episode], ks: np.ndarray) -> dict[str, float]:
    hits = np.array([_hits(e, int(k)) for e, k in zip(episodes, ks)], dtype=np.float64)
    gold = np.array([e.n_gold for e in episodes], dtype=np.float64)
    whole = np.array([int(k) >= e.n_tools for e, k in zip(episodes, ks)])
    return {
        "n": len(episodes),
        "any": float(np.mean(hits > 0)),
        "recall": float(np.mean(hits / gold)),
        "all": float(np.mean(hits >= gold)),
        "mean_k": float(np.mean(ks)),
        "whole": float(np.mean(whole)),
    }


def fixed_curves(episodes: Sequence[Episode], cap: int = CAP) -> dict[str, np.ndarray]:
    """any / recall / all of fixed top-K, K = 0..cap (K capped at each registry's size)."""
    curves = {m: np.zeros(cap + 1) for m in ("any", "recall", "all")}
    for k in range(1, cap + 1):
        ks = np.array([min(k, e.n_tools, e.scores.size) for e in episodes])
        o = outcome(episodes, ks)
        for m in curves:
            curves[m][k] = o[m]
    return curves


def at_k(curve: np.ndarray, mean_k: float) -> float:
    return float(np.interp(mean_k, np.arange(curve.size), curve))


def efficiency(curve: np.ndarray, found: float, mean_k: float) -> float:
    """K_eq / mean K: the fixed depth with the same found rate over the policy's mean depth."""
    if found <= curve[1]:
        k_eq = found / curve[1] if curve[1] > 0 else 0.0
    elif found > curve[-1]:
        return float("inf")
    else:
        j = int(np.searchsorted(curve, found))
        lo, hi = curve[j - 1], curve[j]
        k_eq = j - 1 + ((found - lo) / (hi - lo) if hi > lo else 1.0)
    return k_eq / mean_k if mean_k > 0 else float("nan")


def depths(policy: Callable[[Episode], int], episodes: Sequence[Episode]) -> np.ndarray:
    return np.array([policy(e) for e in episodes], dtype=np.int64)


def evaluate(policy: Callable[[Episode], int], bundle: dict[str, Any]) -> dict[str, Any]:
    full = bundle["hybrid"]
    res = outcome(full, depths(policy, full))
    frontier = {m: 0.0 for m in ("any", "recall", "all")}
    for scorer in SCORER_NAMES:
        curves = fixed_curves(bundle[scorer])
        for m in frontier:
            frontier[m] = max(frontier[m], at_k(curves[m], res["mean_k"]))
    hybrid = fixed_curves(full)
    small: dict[str, Any] = {}
    carves = bundle["carve_eval"]
    for n in EVAL_SIZES:
        eps = [e for e in carves if e.n_tools == n]
        if eps:
            o = outcome(eps, depths(policy, eps))
            o["efficiency"] = efficiency(fixed_curves(eps)["any"], o["any"], o["mean_k"])
            small[str(n)] = o
    return {
        **res,
        "frontier": frontier,
        "efficiency_any": efficiency(hybrid["any"], res["any"], res["mean_k"]),
        "small": small,
    }


# ----------------------------------------------------------------------------- training


def needs_rows(episodes: Sequence[Episode]) -> list[np.ndarray]:
    return [needs_inputs(e.signals, e.scores, depth_features(e.scores, e.n_tools, 1)[0]) for e in episodes]


def fit_needs(bundles: Sequence[dict[str, Any]]) -> NeedsModel:
    full = [e for b in bundles for e in b["hybrid"]]
    return NeedsModel.fit(needs_rows(full), [e.n_gold for e in full])


def train(bundles: Sequence[dict[str, Any]], recipe: str, args: argparse.Namespace) -> Any:
    """The policy of ``recipe`` (``today`` | ``needs``) trained on ``bundles``."""
    from registry.offline.train import train_ensemble
    from registry.serving.needs import NEEDS_FEATURE_NAMES, NEEDS_SCHEMA_VERSION, needs_features

    episodes = [e for b in bundles for e in (*b["hybrid"], *b["carve_train"])]
    hp: dict[str, Any] = dict(
        reward_min_n=args.reward_min_n, step_cost=0.01, gamma=0.98, max_depth=50,
        steps=args.steps, batch_size=512, hidden=(32, 32), lr=1e-3,
    )
    seeds = list(range(args.ensemble))
    if recipe == "today":
        return train_ensemble(episodes, seeds, reward="bor", **hp)
    model = fit_needs(bundles)

    def featurize(e: Episode, d: int) -> np.ndarray:
        return needs_features(e.scores, e.n_tools, d, e.signals, model)

    trained = train_ensemble(episodes, seeds, reward="needs", featurize=featurize, **hp)
    trained.needs_model = model
    trained.feature_names = NEEDS_FEATURE_NAMES
    trained.feature_schema_version = NEEDS_SCHEMA_VERSION
    return trained


def as_fn(policy: Any) -> Callable[[Episode], int]:
    if hasattr(policy, "needs_model") and policy.needs_model is not None:
        return lambda e: int(policy.choose_depth(e.scores, e.n_tools, CAP, signals=e.signals))
    return lambda e: int(policy.choose_depth(e.scores, e.n_tools, CAP))


# ----------------------------------------------------------------------------- report


def _p(x: float) -> str:
    return f"{100 * x:.1f}"


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| source (multi-tool share) | policy | any / recall / all @ mean K | frontier any / recall / all | "
        "recall - frontier | all - frontier | efficiency | small registries 5/8/16/24: efficiency, whole |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results["sources"].items():
        for policy, r in row["policies"].items():
            f = r["frontier"]
            small = ", ".join(
                f"{n}: {s['efficiency']:.2f} / {_p(s['whole'])}%" for n, s in r["small"].items()
            )
            lines.append(
                f"| {name} ({_p(row['multi_share'])}%) | {policy} | {_p(r['any'])} / {_p(r['recall'])} / "
                f"{_p(r['all'])} @ {r['mean_k']:.2f} | {_p(f['any'])} / {_p(f['recall'])} / {_p(f['all'])} | "
                f"{100 * (r['recall'] - f['recall']):+.1f} | {100 * (r['all'] - f['all']):+.1f} | "
                f"{r['efficiency_any']:.2f} | {small} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table-cache", type=Path, required=True, help="score tables and episode files")
    ap.add_argument("--embedder-cache", type=Path, default=None, help="MiniLM ONNX cache")
    ap.add_argument("--embedding-cache", type=Path, default=None, help="text embeddings (bench/embed_cache.py)")
    ap.add_argument("--max-queries", type=int, default=600, help="queries sampled per source (seed 0)")
    ap.add_argument("--carve-per-query", type=int, default=2)
    ap.add_argument("--carve-eval-queries", type=int, default=150)
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--ensemble", type=int, default=1)
    ap.add_argument("--reward-min-n", type=int, default=1024)
    ap.add_argument("--sources", nargs="*", default=None, help="held-out sources (default: all)")
    ap.add_argument(
        "--folds", type=int, default=0,
        help="group the sources into this many folds (source i in fold i %% folds, by name) and hold out a "
        "fold at a time: every source is still tested by policies that never saw it (0: one source per fold)",
    )
    ap.add_argument("--pool", nargs="*", default=None, help="sources in the LOSO pool (default: all 13)")
    ap.add_argument("--shipped", type=Path, default=ROOT / "models" / "default")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--export", type=Path, default=None,
        help="after the LOSO rows, train the needs recipe on every source of the pool and export it here",
    )
    ap.add_argument("--skip-loso", action="store_true", help="with --export: only train and export")
    ap.add_argument(
        "--fold-embedders", type=Path, default=None,
        help="score each source with the fine-tune of bench/ranking_loso.py --finetune --workdir DIR that "
        "held it out (the tuned model's scores on registries it never saw); use its own --table-cache",
    )
    args = ap.parse_args(argv)

    import torch

    from registry.index.minilm_export import load_minilm
    from registry.serving.depth_policies import OnnxDepthPolicy
    from registry.settings import Settings

    torch.set_num_threads(1)
    from bench.embed_cache import disk_cached
    from bench.peers import ranker_for

    embedder = None if args.fold_embedders else disk_cached(
        load_minilm(args.embedder_cache or Settings().resolved_embedder_cache()), args.embedding_cache)
    t0 = time.perf_counter()
    bundles = []
    for d in source_dirs():
        if args.pool and d.name not in args.pool:
            continue
        bundles.append(source_bundle(d, ranker_for(d.name, embedder, args.fold_embedders, args.embedding_cache), args))
        print(f"[{time.perf_counter() - t0:.0f}s] {d.name}: {len(bundles[-1]['hybrid'])} queries", file=sys.stderr, flush=True)
    shipped = OnnxDepthPolicy.from_dir(args.shipped)
    results: dict[str, Any] = {
        "protocol": f"LOSO over {len(bundles)} sources, {args.max_queries} queries sampled per source (seed 0), "
        f"cap {CAP}, {args.steps} DQN steps x {args.ensemble} seed(s), carve {args.carve_per_query}/query",
        "sources": {},
    }
    held = set(args.sources or [b["name"] for b in bundles])
    names = sorted(b["name"] for b in bundles)
    n_folds = args.folds or len(names)
    fold_of = {name: i % n_folds for i, name in enumerate(names)}
    results["folds"] = {str(f): [n for n in names if fold_of[n] == f] for f in range(n_folds)}
    for fold in range(0 if args.skip_loso else n_folds):
        tested = [b for b in bundles if fold_of[b["name"]] == fold and b["name"] in held]
        if not tested:
            continue
        others = [o for o in bundles if fold_of[o["name"]] != fold]
        policies = {recipe: as_fn(train(others, recipe, args)) for recipe in ("today", "needs")}
        policies["shipped"] = as_fn(shipped)
        for b in tested:
            row: dict[str, Any] = {
                "n_tools": b["n_tools"], "multi_share": b["multi_share"], "mean_gold": b["mean_gold"],
                "multi_tool": b["multi_share"] >= MULTI_SHARE, "fold": fold,
                "policies": {name: evaluate(fn, b) for name, fn in policies.items()},
            }
            results["sources"][b["name"]] = row
            print(f"[{time.perf_counter() - t0:.0f}s] held out {b['name']}: "
                  + json.dumps({k: {m: round(v[m], 3) for m in ('any', 'recall', 'all', 'mean_k')}
                                for k, v in row["policies"].items()}),
                  file=sys.stderr, flush=True)
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(results, indent=2))
    print(markdown(results))
    if args.export is not None:
        export_all(bundles, args, results)
    return 0


def export_all(bundles: Sequence[dict[str, Any]], args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Train the needs recipe on every source and write ``policy.onnx`` + manifest to ``--export``."""
    from registry.offline.export import export_onnx

    trained = train(bundles, "needs", args)
    training_data = {
        "command": "nice -n 10 python bench/needs_loso.py " + " ".join(sys.argv[1:]),
        "sources": {b["name"]: {"n_tools": b["n_tools"], "n_queries": len(b["hybrid"])} for b in bundles},
        "max_queries": args.max_queries,
        "scorer": "hybrid",
        "carved": {"per_query": args.carve_per_query, "n_episodes": sum(len(b["carve_train"]) for b in bundles)},
        "hyperparameters": trained.config,
    }
    metrics = {"loso": results.get("sources", {}), "protocol": results.get("protocol"), "folds": results.get("folds")}
    path = export_onnx(trained, args.export, training_data=training_data, metrics=metrics, seed=0, scorer="hybrid")
    print(f"exported {path}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
