"""Chains of tools: step-wise and whole-list coverage, with and without the prerequisite graph.

    nice -n 10 python bench/chains.py --max-queries 150 --json out/chains.json

Sources whose gold is in call order: nestful, nestools, api_bank, tooltalk, star
(``../shared/data/train``) and the MCP tasks under ``bench/data``. Every query goes through an
in-process :class:`registry.assembly.Registries` built as the service builds it (real
MiniLM, the default policy, exploration off), once per configuration:

* **step-wise** (queries needing 2+ tools; steps 2..m): at step ``i`` the agent has called gold
  ``1..i-1``; is gold ``i`` shown? *with called*: the request carries ``called``; *without*:
  the same request without it (the list the agent got at the start); *top-K*: the hybrid
  ranking cut at the with-called lists' mean K (linear between integer K); *top-K minus
  called*: the same ranking with the called tools removed first (what dropping them alone
  gives, without the graph).
* **whole list** (every query): the default list with the graph (prerequisites appended) and
  with the graph emptied, and the best fixed top-K of the three scorers at the graph lists'
  mean K (the frontier): any-found, recall, all-needed and mean K.

Companions learned from agents' feedback are measured through the learning loop by
``bench/companions.py``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import MCP_TASK_SOURCES as MCP_SOURCES  # noqa: E402
from bench.common import ORDERED_SOURCES as SOURCES  # noqa: E402
from bench.common import policy_engine  # noqa: E402
from registry.index.graph import ToolGraph  # noqa: E402
from registry.request import ShortlistRequest  # noqa: E402

SHARED = ROOT.parent.parent / "shared" / "data" / "train"
DEEP_K = 20
SCORERS = ("bm25", "dense", "hybrid")
REGISTRY = "chains"


class MemoEmbedder:
    """The embedder with its query vectors remembered (each query is asked many times)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self._memo: dict[str, np.ndarray] = {}

    def embed_query(self, text: str) -> np.ndarray:
        if text not in self._memo:
            self._memo[text] = self.inner.embed_query(text)
        return self._memo[text]

    def embed_documents(self, texts: Any, batch_size: int = 32) -> np.ndarray:
        return self.inner.embed_documents(texts, batch_size=batch_size)


def _offered(answer: Any) -> list[set[str]]:
    return [{t.name, *t.alternates} for t in answer.tools]


def _interp(curve: np.ndarray, k: float) -> float:
    return float(np.interp(k, np.arange(DEEP_K + 1), curve))


def run_source(directory: Path, embedder: Any, policy_dir: Path, max_queries: int) -> dict[str, Any] | None:
    from registry.errors import ValidationFailed
    from registry.offline.datasets import load_dataset

    tools = json.loads((directory / "tools.json").read_text(encoding="utf-8"))
    queries = [q for q in load_dataset(directory).queries if q.gold]
    if len(queries) > max_queries:
        queries = random.Random(0).sample(queries, max_queries)
    t0 = time.perf_counter()
    steps: dict[str, list[float]] = {"with": [], "without": [], "k_with": []}
    step_ranks: list[tuple[list[str], str, set[str]]] = []  # (hybrid ranking, next, called)
    whole: dict[str, list[dict[str, float]]] = {"graph": [], "no_graph": []}
    deep: dict[str, list[list[set[str]]]] = {s: [] for s in SCORERS}
    golds: list[set[str]] = []
    with tempfile.TemporaryDirectory(prefix="chains-") as tmp:
        engine = policy_engine(tools, REGISTRY, Path(tmp), embedder, policy_dir)
        snap = engine.snapshots.snapshot(REGISTRY)
        plain = replace(snap, graph=ToolGraph())
        for q in queries:
            gold = list(dict.fromkeys(q.gold))
            try:
                with_graph = engine.shortlist(ShortlistRequest(REGISTRY, q.query))
                engine.snapshots.install(plain)
                no_graph = engine.shortlist(ShortlistRequest(REGISTRY, q.query))
                engine.snapshots.install(snap)
                lists = {s: engine.shortlist(ShortlistRequest(REGISTRY, q.query, k=DEEP_K, scorer=s)) for s in SCORERS}
            except ValidationFailed:  # a request over max_query_chars: the service's 422
                engine.snapshots.install(snap)
                continue
            for name, answer in (("graph", with_graph), ("no_graph", no_graph)):
                offered = set().union(*_offered(answer)) if answer.tools else set()
                hits = len(offered & set(gold))
                whole[name].append({"any": float(hits > 0), "recall": hits / len(gold),
                                    "all": float(hits == len(gold)), "k": float(len(answer.tools))})
            for s in SCORERS:
                deep[s].append(_offered(lists[s]))
            golds.append(set(gold))
            start = set().union(*_offered(with_graph)) if with_graph.tools else set()
            ranking = [t.name for t in lists["hybrid"].tools]
            for i in range(1, len(gold)):
                called = tuple(gold[:i])
                answer = engine.shortlist(ShortlistRequest(REGISTRY, q.query, called=called))
                shown = set().union(*_offered(answer)) if answer.tools else set()
                steps["with"].append(float(gold[i] in shown))
                steps["without"].append(float(gold[i] in start))
                steps["k_with"].append(float(len(answer.tools)))
                step_ranks.append((ranking, gold[i], set(called)))
    if not golds:
        return None
    row: dict[str, Any] = {"source": directory.name, "n_tools": len(tools), "n_queries": len(golds),
                           "multi_share": float(np.mean([len(g) > 1 for g in golds])),
                           "seconds": round(time.perf_counter() - t0, 1)}
    if step_ranks:
        mean_k = float(np.mean(steps["k_with"]))
        topk = np.zeros(DEEP_K + 1)
        topk_minus = np.zeros(DEEP_K + 1)
        for k in range(1, DEEP_K + 1):
            topk[k] = np.mean([nxt in ranking[:k] for ranking, nxt, _ in step_ranks])
            topk_minus[k] = np.mean([nxt in [t for t in ranking if t not in done][:k] for ranking, nxt, done in step_ranks])
        row["steps"] = {"n": len(step_ranks), "with_called": float(np.mean(steps["with"])),
                        "without_called": float(np.mean(steps["without"])), "mean_k": mean_k,
                        "topk": _interp(topk, mean_k), "topk_minus_called": _interp(topk_minus, mean_k)}
    mean = {name: {m: float(np.mean([r[m] for r in rows])) for m in ("any", "recall", "all", "k")}
            for name, rows in whole.items()}
    frontier: dict[str, float] = {}
    for m in ("any", "recall", "all"):
        best = 0.0
        for s in SCORERS:
            curve = np.zeros(DEEP_K + 1)
            for k in range(1, DEEP_K + 1):
                vals = []
                for lst, g in zip(deep[s], golds):
                    hits = len(set().union(*lst[:k]) & g) if lst else 0
                    vals.append({"any": hits > 0, "recall": hits / len(g), "all": hits == len(g)}[m])
                curve[k] = float(np.mean(vals))
            best = max(best, _interp(curve, mean["graph"]["k"]))
        frontier[m] = best
    row["whole"] = mean | {"frontier": frontier}
    return row


def main() -> None:
    from registry.index.embedders import default_embedder
    from registry.settings import Settings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-queries", type=int, default=150, help="queries sampled per source (seed 0)")
    ap.add_argument("--policy", type=Path, default=ROOT / "models" / "default")
    ap.add_argument("--sources", nargs="*", default=None, help="source names (default: all)")
    ap.add_argument("--dirs", type=Path, nargs="*", default=[],
                    help="more data dirs (tools.json + queries.jsonl), e.g. single-tool sources")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    embedder = MemoEmbedder(default_embedder(Settings()))
    dirs = [SHARED / s for s in SOURCES] + [ROOT / "bench" / "data" / s for s in MCP_SOURCES]
    dirs = [d for d in dirs if (d / "queries.jsonl").is_file() and (args.sources is None or d.name in args.sources)]
    dirs += args.dirs
    rows = []
    for directory in dirs:
        row = run_source(directory, embedder, args.policy, args.max_queries)
        if row is None:
            continue
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\nstep-wise (next needed tool shown, steps after the first call)")
    print(f"{'source':24} {'n':>5} {'with':>6} {'without':>8} {'top-K':>6} {'-called':>8} {'mean K':>7}")
    for r in rows:
        if "steps" in r:
            s = r["steps"]
            print(f"{r['source']:24} {s['n']:5d} {s['with_called']:6.3f} {s['without_called']:8.3f} "
                  f"{s['topk']:6.3f} {s['topk_minus_called']:8.3f} {s['mean_k']:7.2f}")
    print("\nwhole list (recall / all-needed / any-found @ mean K): graph, no graph, frontier at graph's K")
    print("(the default list with the prerequisite graph; with the graph emptied; the best fixed top-K of the")
    print(" three scorers at the graph lists' mean K)")
    pooled: dict[str, list[float]] = {"graph": [], "no_graph": [], "frontier": []}
    for r in rows:
        w = r["whole"]
        print(f"{r['source']:24} multi {r['multi_share']:.2f}  graph {w['graph']['recall']:.3f}/{w['graph']['all']:.3f}/"
              f"{w['graph']['any']:.3f} @{w['graph']['k']:.2f}   no graph {w['no_graph']['recall']:.3f}/"
              f"{w['no_graph']['all']:.3f}/{w['no_graph']['any']:.3f} @{w['no_graph']['k']:.2f}   frontier "
              f"{w['frontier']['recall']:.3f}/{w['frontier']['all']:.3f}/{w['frontier']['any']:.3f}")
        for name in ("graph", "no_graph"):
            pooled[name].append(w[name]["recall"])
        pooled["frontier"].append(w["frontier"]["recall"])
    if rows:
        print("pooled recall (mean over sources): " + ", ".join(f"{k} {np.mean(v):.3f}" for k, v in pooled.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
