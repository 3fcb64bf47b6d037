"""Our default shortlist against the peers' documented defaults and the fixed-K frontier, per source.

    nice -n 10 python bench/peers.py --embedding-cache /tmp/i19d/emb --json out/peers.json

Peers return a fixed count; each is emulated with our own scorers, so the comparison is about
list length, not about ranking: Anthropic's tool search = BM25 top-5, bigtool = dense top-2,
ToolHive = hybrid top-8, LiteLLM = dense top-10. The **frontier** is the best of BM25, dense and
hybrid top-K at our default's mean K (linear between integer K), per metric.

Per source (the ten sets of ``../shared/data/train`` and the three dev sets, ``--max-queries``
sampled with seed 0, the same sample as the score tables), every query goes through an
in-process :class:`registry.assembly.Registries` built as the service builds it (real
MiniLM, the ``--policy`` artifact, multi-intent composition on; exploration off, so two runs
serve the same lists), once with the defaults and once per scorer with ``k=20`` (the plain
ranking, from which every fixed-K point comes). ``--coverage FILE`` / ``--coverage-dir DIR``
(``DIR/<source>.json``, the held-out models of ``bench/studies/coverage_loso.py``) turn the coverage
refinement on; ``--dump`` writes each request's lists, the rows that script fits on.
``--fold-embedders DIR`` ranks each source with the fine-tune of ``bench/studies/ranking_loso.py
--finetune --workdir DIR`` that held it out, so a tuned ranker is measured on sources it never
saw (``--embedder`` is then not loaded).
Printed: any-found (a needed tool shown), recall (share of needed tools shown), all-needed,
mean K and the definition tokens shown (JSON characters / 4), for our default, each peer and
the frontier; then the goal checks of issue 19 (multi-tool sources: recall and all-needed
>= 5 points above the frontier, >= 95% of hybrid top-8's recall with >= 25% fewer tokens;
single-tool sources: any-found not below the frontier, depth efficiency >= 1.3) and, per
source, which peer points the default beats on both recall and tokens.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from registry.request import ShortlistRequest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    DEEP_K,
    MULTI_SHARE,
    SCORER_NAMES,
    DiskCachedEmbedder,
    Slot,
    answer_slots,
    disk_cached,
    efficiency,
    policy_engine,
    ranker_for,
    source_dirs,
    trained_queries,
)
from bench.common import score_slots as _score  # noqa: E402

PEERS: dict[str, tuple[str, int]] = {
    "BM25 top-5 (Anthropic)": ("bm25", 5),
    "dense top-2 (bigtool)": ("dense", 2),
    "hybrid top-8 (ToolHive)": ("hybrid", 8),
    "dense top-10 (LiteLLM)": ("dense", 10),
}
METRICS = ("any", "recall", "all")


def _sample(queries: list[Any], n: int | None) -> list[Any]:
    return random.Random(0).sample(queries, n) if n is not None and len(queries) > n else queries


def run_source(
    directory: Path, embedder: Any, policy_dir: Path, max_queries: int | None, dump: list[dict[str, Any]] | None = None,
    coverage: Path | None = None, depth_bias: float | None = None, unseen_by: Path | None = None,
) -> dict[str, Any] | None:
    """``directory``'s figures (None: no request to measure)."""
    from registry.errors import ValidationFailed
    from registry.offline.datasets import load_dataset

    tools = json.loads((directory / "tools.json").read_text(encoding="utf-8"))
    tokens = {t["name"]: len(json.dumps(t, ensure_ascii=False)) / 4 for t in tools}
    queries = load_dataset(directory).queries
    if unseen_by is not None:  # only requests that fine-tune never trained on
        seen = trained_queries(unseen_by, directory.name, queries)
        queries = [q for i, q in enumerate(queries) if i not in seen]
    queries = [q for q in _sample(queries, max_queries) if q.gold]
    if not queries:
        return None
    registry = "peers"
    ours: list[dict[str, float]] = []
    ranked: dict[str, list[list[Slot]]] = {s: [] for s in SCORER_NAMES}
    golds: list[set[str]] = []
    rejected = 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        engine = policy_engine(tools, registry, Path(tmp), embedder, policy_dir, coverage)
        for q in queries:
            gold = set(q.gold)
            try:
                answer = engine.shortlist(ShortlistRequest(registry, q.query, depth_bias=depth_bias))
                deep = {s: engine.shortlist(ShortlistRequest(registry, q.query, k=DEEP_K, scorer=s))
                        for s in SCORER_NAMES}
                lists = {s: answer_slots(a) for s, a in deep.items()}
            except ValidationFailed:  # a request over max_query_chars: the service's 422
                rejected += 1
                continue
            ours.append(_score(answer_slots(answer), gold, tokens))
            if dump is not None:  # per-query lists, for offline studies of depth and composition
                dump.append({
                    "source": directory.name, "query": q.query, "gold": sorted(gold), "n_tools": len(tools),
                    "ours": answer_slots(answer), "ours_scores": [t.score for t in answer.tools],
                    "intents": list(answer.intents), **{s: lists[s] for s in SCORER_NAMES},
                    "hybrid_scores": [t.score for t in deep["hybrid"].tools],
                })
            for s in SCORER_NAMES:
                ranked[s].append(lists[s])
            golds.append(gold)
    mean = {m: float(np.mean([o[m] for o in ours])) for m in (*METRICS, "k", "tokens")}
    curves: dict[str, dict[str, np.ndarray]] = {}
    for s in SCORER_NAMES:
        curves[s] = {m: np.zeros(DEEP_K + 1) for m in (*METRICS, "tokens")}
        for k in range(1, DEEP_K + 1):
            rows = [_score(r[:k], g, tokens) for r, g in zip(ranked[s], golds)]
            for m in (*METRICS, "tokens"):
                curves[s][m][k] = float(np.mean([row[m] for row in rows]))
    peers = {
        name: {m: float(curves[s][m][k]) for m in (*METRICS, "tokens")} | {"k": float(k)}
        for name, (s, k) in PEERS.items()
    }
    frontier = best_fixed(curves, mean["k"])
    frontier["tokens"] = float(np.interp(mean["k"], np.arange(DEEP_K + 1), curves["hybrid"]["tokens"]))
    multi_share = float(np.mean([len(g) > 1 for g in golds])) if golds else 0.0
    return {
        "source": directory.name,
        "n_tools": len(tools),
        "n_queries": len(ours),
        "rejected": rejected,
        "multi_share": multi_share,
        "multi_tool": multi_share >= MULTI_SHARE,
        "mean_gold": float(np.mean([len(g) for g in golds])) if golds else 0.0,
        "ours": mean,
        "peers": peers,
        "frontier": frontier,
        "efficiency": efficiency(curves["hybrid"]["any"], mean["any"], mean["k"]),
        "curves": {s: {m: [float(x) for x in c] for m, c in per.items()} for s, per in curves.items()},
        "seconds": round(time.perf_counter() - t0, 1),
    }


def goals(row: dict[str, Any]) -> dict[str, Any]:
    ours, front, top8 = row["ours"], row["frontier"], row["peers"]["hybrid top-8 (ToolHive)"]
    beats = [
        name for name, p in row["peers"].items() if ours["recall"] >= p["recall"] and ours["tokens"] < p["tokens"]
    ]
    if row["multi_tool"]:
        checks = {
            "recall_vs_frontier": ours["recall"] - front["recall"],
            "all_vs_frontier": ours["all"] - front["all"],
            "recall_share_of_top8": ours["recall"] / top8["recall"] if top8["recall"] else float("nan"),
            "token_saving_vs_top8": 1 - ours["tokens"] / top8["tokens"] if top8["tokens"] else float("nan"),
        }
        met = (checks["recall_vs_frontier"] >= 0.05 and checks["all_vs_frontier"] >= 0.05
               and checks["recall_share_of_top8"] >= 0.95 and checks["token_saving_vs_top8"] >= 0.25)
    else:
        checks = {"any_vs_frontier": ours["any"] - front["any"], "efficiency": row["efficiency"]}
        met = checks["any_vs_frontier"] >= 0 and checks["efficiency"] >= 1.3
    return {"checks": checks, "met": bool(met), "beats_on_recall_and_tokens": beats}


def best_fixed(curves: dict[str, Any], k: float) -> dict[str, float]:
    """Per metric, the best of the scorers' fixed-K ``curves`` (index = K) at ``k``, linear
    between integer K: the frontier a list of mean length ``k`` is measured against."""
    return {m: max(float(np.interp(k, np.arange(len(c[m])), c[m])) for c in curves.values()) for m in METRICS}


def outside_frontier(row: dict[str, Any], outside: dict[str, Any]) -> dict[str, float]:
    """The best fixed list of another run's scorers (``outside``: the same source from a
    ``--embedder minilm`` run, i.e. plain MiniLM + BM25) at *this* row's mean K, per metric."""
    return best_fixed(outside["curves"], row["ours"]["k"])


def ranker_goals(row: dict[str, Any]) -> dict[str, Any]:
    """The ranking goals against the outside frontier (``row["outside"]``) and our own: multi-tool
    sources need recall and all-needed >= outside + 5 points and >= our own frontier - 0.5, and
    at least hybrid top-8's recall with >= 25% fewer tokens; single-tool sources any-found >=
    outside + 3 and >= our own frontier."""
    ours, own, out = row["ours"], row["frontier"], row["outside"]
    top8 = row["peers"]["hybrid top-8 (ToolHive)"]
    if row["multi_tool"]:
        checks = {
            "recall_vs_outside": ours["recall"] - out["recall"],
            "all_vs_outside": ours["all"] - out["all"],
            "recall_vs_own": ours["recall"] - own["recall"],
            "all_vs_own": ours["all"] - own["all"],
            "recall_vs_top8": ours["recall"] - top8["recall"],
            "token_saving_vs_top8": 1 - ours["tokens"] / top8["tokens"] if top8["tokens"] else float("nan"),
        }
        met = (min(checks["recall_vs_outside"], checks["all_vs_outside"]) >= 0.05
               and min(checks["recall_vs_own"], checks["all_vs_own"]) >= -0.005
               and checks["recall_vs_top8"] >= 0 and checks["token_saving_vs_top8"] >= 0.25)
    else:
        checks = {"any_vs_outside": ours["any"] - out["any"], "any_vs_own": ours["any"] - own["any"]}
        met = checks["any_vs_outside"] >= 0.03 and checks["any_vs_own"] >= 0
    return {"checks": checks, "met": bool(met)}


def ranker_markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| source | ours @ mean K | own frontier | outside frontier (plain MiniLM + BM25) | "
             "hybrid top-8 | ranking goals |", "|---|---|---|---|---|---|"]
    for row in rows:
        g = row["ranker_goals"]
        checks = ", ".join(
            f"{n} {100 * v:+.1f}" if "vs" in n else f"{n} {100 * v:.0f}%" for n, v in g["checks"].items()
        )
        ours, top8 = row["ours"], row["peers"]["hybrid top-8 (ToolHive)"]
        lines.append(
            f"| {row['source']} | {_p(ours['any'])} / {_p(ours['recall'])} / {_p(ours['all'])} @ {ours['k']:.2f} | "
            + " | ".join(f"{_p(f['any'])} / {_p(f['recall'])} / {_p(f['all'])}" for f in (row["frontier"], row["outside"]))
            + f" | {_p(top8['recall'])} rec, {top8['tokens']:.0f} tok vs {ours['tokens']:.0f}"
            + f" | {'met' if g['met'] else 'NOT met'}: {checks} |"
        )
    return "\n".join(lines)


def _p(x: float) -> str:
    return f"{100 * x:.1f}"


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    head = ["source (tools, multi-tool share)", "our default", "frontier at our mean K", *PEERS, "goal checks"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(r: dict[str, float], k: float | None = None) -> str:
        k = r["k"] if k is None else k
        tail = f" @ {k:.2f}" + (f", {r['tokens']:.0f} tok" if "tokens" in r else "")
        return f"{_p(r['any'])} / {_p(r['recall'])} / {_p(r['all'])}{tail}"

    for row in rows:
        g = row["goals"]
        checks = ", ".join(
            f"{name} {value:+.3f}" if "vs" in name else f"{name} {value:.2f}" for name, value in g["checks"].items()
        )
        lines.append(
            f"| {row['source']} ({row['n_tools']}, {_p(row['multi_share'])}%) | {cell(row['ours'])} | "
            f"{_p(row['frontier']['any'])} / {_p(row['frontier']['recall'])} / {_p(row['frontier']['all'])} | "
            + " | ".join(cell(p) for p in row["peers"].values())
            + f" | {'met' if g['met'] else 'NOT met'}: {checks} |"
        )
    lines.append("")
    lines.append("Cells: any-found / recall / all-needed (%) @ mean K, definition tokens shown per request.")
    for row in rows:
        beats = row["goals"]["beats_on_recall_and_tokens"]
        lines.append(f"- {row['source']}: the default beats on both recall and tokens: {', '.join(beats) or 'none'}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from registry.settings import EMBEDDERS, Settings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-queries", type=int, default=600, help="queries sampled per source (seed 0)")
    ap.add_argument("--policy", type=Path, default=ROOT / "models" / "default")
    ap.add_argument("--embedder-cache", type=Path, default=None, help="MiniLM ONNX cache")
    ap.add_argument("--embedder", choices=EMBEDDERS, default=Settings().embedder,
                    help="SHORTLIST_EMBEDDER value (default: the service default, tuned)")
    ap.add_argument("--embedding-cache", type=Path, default=None, help="text embeddings (bench/common.py DiskCachedEmbedder)")
    ap.add_argument("--sources", nargs="*", default=None, help="source names (default: all)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--coverage", type=Path, default=None, help="coverage model file for every source")
    ap.add_argument("--coverage-dir", type=Path, default=None,
                    help="held-out coverage models, <dir>/<source>.json (bench/studies/coverage_loso.py)")
    ap.add_argument("--dump", type=Path, default=None, help="per-query lists (JSON lines), for offline studies")
    ap.add_argument("--extra", type=Path, nargs="*", default=[],
                    help="more source directories, e.g. bench/data/mcp_servers (the project's MCP tasks)")
    ap.add_argument("--fold-embedders", type=Path, default=None,
                    help="rank each source with the held-out fine-tune of bench/studies/ranking_loso.py --workdir DIR")
    ap.add_argument("--unseen-by", type=Path, default=None, metavar="MANIFEST",
                    help="sample only requests the fine-tune of this manifest (models/tuned-embedder/"
                         "manifest.json) did not train on: known tools, new phrasings")
    ap.add_argument("--outside", type=Path, default=None, metavar="JSON",
                    help="the --json of an --embedder minilm run on the same sources and --max-queries: its "
                         "best fixed lists at our mean K are the outside frontier of the ranking goals")
    ap.add_argument("--depth-bias", type=float, default=None,
                    help="the default's depth_bias (default: the service's, 0): where it sits on its curve")
    args = ap.parse_args(argv)

    from registry.index.embedders import default_embedder

    settings = Settings(embedder=args.embedder, embedder_cache_dir=args.embedder_cache)
    # with --fold-embedders every source gets its fold's model, so the run-wide one is not loaded
    embedder = None if args.fold_embedders else disk_cached(default_embedder(settings), args.embedding_cache)
    outside = ({r["source"]: r for r in json.loads(args.outside.read_text())["sources"]}
               if args.outside else {})
    rows = []
    for directory in [*source_dirs(), *args.extra]:
        if args.sources and directory.name not in args.sources:
            continue
        dump: list[dict[str, Any]] | None = [] if args.dump else None
        coverage = args.coverage_dir / f"{directory.name}.json" if args.coverage_dir else args.coverage
        ranker = ranker_for(directory.name, embedder, args.fold_embedders, args.embedding_cache)
        row = run_source(directory, ranker, args.policy, args.max_queries, dump, coverage, args.depth_bias,
                         args.unseen_by)
        if row is None:
            print(f"{directory.name}: every request was trained on; skipped", file=sys.stderr)
            continue
        row["coverage"] = str(coverage) if coverage else None
        row["embedder"] = ranker.model_id
        if isinstance(ranker, DiskCachedEmbedder) and ranker is not embedder:
            ranker.save()
        if args.dump and dump is not None:
            args.dump.parent.mkdir(parents=True, exist_ok=True)
            with args.dump.open("a", encoding="utf-8") as fh:
                fh.writelines(json.dumps(d) + "\n" for d in dump)
        row["goals"] = goals(row)
        if directory.name in outside:
            row["outside"] = outside_frontier(row, outside[directory.name])
            row["ranker_goals"] = ranker_goals(row)
        rows.append(row)
        print(f"{row['source']}: {json.dumps(row['ours'])} ({row['seconds']}s)", file=sys.stderr, flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(
                json.dumps({"policy": str(args.policy), "embedder": args.embedder, "depth_bias": args.depth_bias,
                            "sources": rows}, indent=2)
            )
    if isinstance(embedder, DiskCachedEmbedder):
        embedder.save()
    print(markdown(rows))
    if any("ranker_goals" in r for r in rows):
        print("\nRanking goals (cells: any-found / recall / all-needed %):")
        print(ranker_markdown([r for r in rows if "ranker_goals" in r]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
