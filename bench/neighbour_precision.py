"""Pair precision of request neighbours, per embedder: how often a past request at cosine >= s
names the same tool as a new one (what the usage memory's ``SHORTLIST_LEARNING_SIMILARITY``
relies on).

    python bench/neighbour_precision.py --embedding-cache data/cache/emb [--fold-embedders data/ft_l6s300]

For each dev set, 800 queries (seed 0) are split in half: "new" and "past" requests. For every
(new, past) pair at cosine >= s it prints the share that share a gold tool (precision), the
share of same-tool pairs reached (recall) and the pair count, for plain MiniLM and, with
``--fold-embedders``, the tuned fold model that never saw the set (the scores a new registry
gets with the tuned default).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.embed_cache import disk_cached  # noqa: E402
from registry.index.minilm_export import load_minilm  # noqa: E402
from registry.offline.datasets import load_dataset  # noqa: E402
from registry.offline.finetune_loso import held_out_embedder  # noqa: E402

SETS = ("bfcl_simple", "metatool", "toolbench_stable")
THRESHOLDS = (0.6, 0.7, 0.8, 0.85, 0.9)


def pair_table(embedder: Any, new: Sequence[Any], past: Sequence[Any]) -> list[tuple[float, float, float, int]]:
    """(threshold, precision, recall, pairs) of ``new`` x ``past`` at each of :data:`THRESHOLDS`."""
    same = np.array([[bool(set(x.gold) & set(y.gold)) for y in past] for x in new])
    cos = np.asarray(embedder.embed_documents([q.query for q in new])) @ np.asarray(
        embedder.embed_documents([q.query for q in past])).T
    rows = []
    for t in THRESHOLDS:
        near = cos >= t
        precision = float(same[near].mean()) if near.any() else float("nan")
        rows.append((t, precision, float((same & near).sum() / max(1, same.sum())), int(near.sum())))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--embedder-cache", type=Path, default=ROOT / "data" / "cache" / "embedder")
    ap.add_argument("--embedding-cache", type=Path, default=None, help="text embeddings (bench/embed_cache.py)")
    ap.add_argument("--fold-embedders", type=Path, default=None)
    ap.add_argument("--queries", type=int, default=800)
    args = ap.parse_args(argv)

    minilm = disk_cached(load_minilm(args.embedder_cache), args.embedding_cache)
    print("| set | embedder | " + " | ".join(f"s={t}: precision / recall (pairs)" for t in THRESHOLDS) + " |")
    print("|---|---|" + "---|" * len(THRESHOLDS))
    for name in SETS:
        queries = list(load_dataset(args.data / name).queries)
        random.Random(0).shuffle(queries)
        queries = queries[: args.queries]
        new, past = queries[: len(queries) // 2], queries[len(queries) // 2 :]
        embedders = [("minilm", minilm)]
        if args.fold_embedders:
            embedders.append(("tuned, held out",
                              disk_cached(held_out_embedder(args.fold_embedders, name), args.embedding_cache)))
        for label, embedder in embedders:
            cells = [f"{p * 100:.0f}% / {r * 100:.0f}% ({n})" for _, p, r, n in pair_table(embedder, new, past)]
            print(f"| {name} | {label} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
