"""The 5-24-tool registry goal with and without the coverage refinement, through the engine.

    nice -n 10 python bench/coverage_small.py --embedding-cache data/cache/emb \\
        --coverage-dir data/models/coverage --json out/coverage_small.json
    nice -n 10 python bench/coverage_small.py --embedding-cache data/cache/emb \\
        --fold-embedders data/ft_l6s300 --max-queries 60 --json out/small_tuned.json   # tuned, held out

For each source and size N in 5 / 8 / 16 / 24 (below the source's size), each of the first
``--max-queries`` queries of the peers sample (seed 0) gets its own registry: its needed tools
plus random others of the source up to N (seed 1). An in-process engine answers it with the
defaults (exploration off), once without and once with the source's held-out coverage model
(``<dir>/<source>.json``, never fitted on that source), and once with the hybrid ranking at
``k = N``. Printed per source and size: found (a needed tool shown or folded in as an
alternate), mean K, depth efficiency (the fixed hybrid depth with the same found rate over
mean K) and the share of answers that are the whole registry. Goal (issue 19): efficiency
>= 1.2 and whole registry <= 1% on registries of 5-24 tools.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.needs_loso import efficiency, source_dirs  # noqa: E402
from bench.peers import _engine, _sample, _score, _slots, ranker_for  # noqa: E402
from registry.request import ShortlistRequest  # noqa: E402

SIZES = (5, 8, 16, 24)


def run_source(directory: Path, embedder: Any, coverage: Path | None, max_queries: int) -> dict[str, Any]:
    from registry.errors import ValidationFailed
    from registry.offline.datasets import load_dataset

    tools = json.loads((directory / "tools.json").read_text(encoding="utf-8"))
    by_name = {t["name"]: t for t in tools}
    queries = [q for q in _sample(load_dataset(directory).queries, 200) if q.gold][:max_queries]
    rng = random.Random(1)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="small-") as tmp:
        base = _engine(tools[:1], "seed", Path(tmp) / "a", embedder, ROOT / "models" / "default")
        engines = {"off": base}
        if coverage is not None:
            engines["on"] = _engine(tools[:1], "seed", Path(tmp) / "b", embedder, ROOT / "models" / "default", coverage)
        for n in (s for s in SIZES if s < len(tools)):
            rows: dict[str, list[dict[str, float]]] = {tag: [] for tag in engines}
            curves: list[list[Any]] = []
            golds: list[set[str]] = []
            for q in queries:
                gold = [g for g in q.gold if g in by_name][:n]
                if not gold:
                    continue
                others = [name for name in by_name if name not in gold]
                names = gold + rng.sample(others, n - len(gold))
                sub = [by_name[name] for name in names]
                try:
                    for tag, engine in engines.items():
                        engine.put_registry("c", sub)
                        answer = engine.shortlist(ShortlistRequest("c", q.query))
                        rows[tag].append(_score(_slots(answer), set(gold), {}) | {"n": float(n)})
                    curves.append(_slots(base.shortlist(ShortlistRequest("c", q.query, k=n, scorer="hybrid"))))
                except ValidationFailed:
                    rows = {tag: r[: len(curves)] for tag, r in rows.items()}
                    continue
                golds.append(set(gold))
            curve = np.zeros(n + 1)
            for k in range(1, n + 1):
                curve[k] = float(np.mean([_score(c[:k], g, {})["any"] for c, g in zip(curves, golds)]))
            cell = {}
            for tag, r in rows.items():
                found = float(np.mean([x["any"] for x in r]))
                mean_k = float(np.mean([x["k"] for x in r]))
                cell[tag] = {"found": found, "k": mean_k, "efficiency": efficiency(curve, found, mean_k),
                             "whole": float(np.mean([x["k"] >= n for x in r])), "queries": len(r)}
            out[str(n)] = cell
    return {"source": directory.name, "sizes": out}


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| source | " + " | ".join(f"N={n}: off / on" for n in SIZES) + " |", "|---|" + "---|" * len(SIZES)]
    for row in rows:
        cells = []
        for n in SIZES:
            c = row["sizes"].get(str(n))
            cells.append("-" if c is None else " / ".join(
                f"{c[t]['found'] * 100:.1f}% @ {c[t]['k']:.2f}, eff {c[t]['efficiency']:.2f}, whole "
                f"{c[t]['whole'] * 100:.1f}%" for t in ("off", "on") if t in c))
        lines.append(f"| {row['source']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-queries", type=int, default=100)
    ap.add_argument("--coverage-dir", type=Path, default=None,
                    help="held-out coverage models, <dir>/<source>.json (default: the default engine only)")
    ap.add_argument("--fold-embedders", type=Path, default=None,
                    help="rank each source with the held-out fine-tune of bench/ranking_loso.py --workdir DIR")
    ap.add_argument("--embedding-cache", type=Path, default=None)
    ap.add_argument("--sources", nargs="*", default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from bench.embed_cache import DiskCachedEmbedder, disk_cached
    from registry.core import default_embedder
    from registry.settings import Settings

    embedder = None if args.fold_embedders else disk_cached(default_embedder(Settings()), args.embedding_cache)
    rows = []
    for directory in source_dirs():
        if args.sources and directory.name not in args.sources:
            continue
        ranker = ranker_for(directory.name, embedder, args.fold_embedders, args.embedding_cache)
        coverage = args.coverage_dir / f"{directory.name}.json" if args.coverage_dir else None
        rows.append(run_source(directory, ranker, coverage, args.max_queries))
        rows[-1]["embedder"] = ranker.model_id
        if isinstance(ranker, DiskCachedEmbedder) and ranker is not embedder:
            ranker.save()
        print(directory.name, json.dumps(rows[-1]["sizes"]), file=sys.stderr, flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"coverage_dir": str(args.coverage_dir), "fold_embedders":
                                             str(args.fold_embedders), "sources": rows}, indent=2))
    if isinstance(embedder, DiskCachedEmbedder):
        embedder.save()
    pooled = {}
    for n in SIZES:
        for tag in ("off", "on"):
            cells = [r["sizes"][str(n)][tag] for r in rows if tag in r["sizes"].get(str(n), {})]
            if cells:
                pooled[f"{n}/{tag}"] = (float(np.mean([c["efficiency"] for c in cells])),
                                        float(np.mean([c["whole"] for c in cells])))
    print(markdown(rows))
    print("\nmean over sources (efficiency, whole share): "
          + ", ".join(f"N={k}: {e:.2f}, {w * 100:.1f}%" for k, (e, w) in pooled.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
