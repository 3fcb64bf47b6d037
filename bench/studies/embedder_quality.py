"""found@1 (hybrid) per source for several embedders on the same queries, e.g. tuned vs tuned-int8.

The goal "int8 within 2.5 points found@1 of its fp32 on every source" is read off this table.
Every embedder embeds every tool and query itself (ONNX, as served), so it is slow on a busy
machine: --max-queries / --max-tools / --sources keep it small.

    python bench/studies/embedder_quality.py --data ../shared/data --embedders tuned tuned-int8 \
        --max-queries 150 --max-tools 400
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from registry.index.embedders import load_minilm
from registry.index.hybrid import HYBRID_ALPHA
from registry.offline.corpus import DEFAULT_DATA_ROOT, load_corpus
from registry.offline.corpus_vectors import corpus_vectors
from registry.offline.ranking import pooled, score_source
from registry.settings import EMBEDDERS, Settings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--embedders", nargs="+", choices=EMBEDDERS, default=["tuned", "tuned-int8"])
    parser.add_argument("--sources", nargs="*", default=None)
    parser.add_argument("--max-queries", type=int, default=150)
    parser.add_argument("--max-tools", type=int, default=400)
    parser.add_argument("--embedder-cache", type=Path, default=None)
    parser.add_argument("--vectors-cache", type=Path, default=Path("data/corpus_vectors"))
    args = parser.parse_args()
    settings = Settings()
    corpus = load_corpus(
        args.data, max_queries=args.max_queries, max_tools=args.max_tools, only=args.sources
    )
    scores = {}
    for name in args.embedders:
        embedder = load_minilm(
            args.embedder_cache or settings.resolved_embedder_cache(),
            embedder=name,
            adapter_dir=settings.tuned_embedder_dir,
        )
        start = time.monotonic()
        vectors = corpus_vectors(corpus, embedder, args.vectors_cache)
        print(f"{name}: {embedder.model_id}, embedded in {time.monotonic() - start:.0f}s", file=sys.stderr)
        scores[name] = [score_source(sv, None, HYBRID_ALPHA) for sv in vectors]
    first = args.embedders[0]
    print("| source | queries | " + " | ".join(f"found@1 {e}" for e in args.embedders) + " | worst delta |")
    print("| --- | ---: |" + " ---: |" * (len(args.embedders) + 1))
    for i, data in enumerate(corpus):
        row = [100 * scores[e][i].found_at_1 for e in args.embedders]
        delta = min(r - row[0] for r in row[1:]) if len(row) > 1 else 0.0
        cells = " | ".join(f"{x:.1f}" for x in row)
        print(f"| {data.name} | {len(data.queries)} | {cells} | {delta:+.1f} |")
    pooled_row = [100 * pooled(scores[e])["found_at_1"] for e in args.embedders]
    print(f"| **pooled** | {sum(len(d.queries) for d in corpus)} | "
          + " | ".join(f"{x:.1f}" for x in pooled_row) + f" | (vs {first}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
