"""Do example values in parameter docs steer the ranking? Tool text with and without them.

A parameter documented as "City name, e.g. Paris" makes every request that names Paris look
like that tool: in the demo registry "what will the weather be in Paris tomorrow" ranks
`get_weather` (current conditions, whose city parameter gives Paris as its example) above
`get_weather_forecast`, by cosine (0.565 against 0.484 with the tuned model; 0.445 without the
example) and by BM25. This study strips the example clauses of the *Parameters* line of each
tool text (from "e.g." / "eg." / "for example" / "for instance" / "example:" / "ex:" to the end of
the clause) and ranks every source both ways, with the same query vectors: plain MiniLM (the
cached corpus vectors) and, with ``--fold-workdir``, each source's held-out fine-tune (the fold
model of ``bench/studies/ranking_loso.py --finetune`` that never saw it; its cached vectors for
the source, only the changed tool texts embedded again). Hybrid at alpha 0.8, as served.

    python bench/studies/example_values.py --data ../shared/data [--fold-workdir data/ft16/loso]

Prints found@1, found@5 and multi-tool recall@5 per source and pooled, with and without examples.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from registry.index.embed import Embedder
from registry.index.embedders import load_minilm
from registry.index.hybrid import HYBRID_ALPHA
from registry.offline.corpus import DEFAULT_DATA_ROOT, MCP_SOURCE, load_corpus, tool_texts
from registry.offline.corpus_vectors import SourceVectors, bm25_matrix, corpus_vectors
from registry.offline.finetune_loso import held_out_embedder, held_out_vectors
from registry.offline.ranking import SourceScore, pooled, score_source
from registry.settings import Settings

# An example clause: its marker, then everything up to the end of the clause (";" ends a
# parameter, ")" a parenthesis, a newline the line). The opening "(" or ", " goes with it.
EXAMPLE = re.compile(
    r"(?:,\s*|\s*\(\s*|\s+)(?:e\.g\.|eg\.|for example|for instance|example:|ex:)[^;)\n]*\)?", re.IGNORECASE
)


def without_examples(text: str) -> str:
    """``text`` with the example clauses of its Parameters line removed (other lines kept)."""
    head, sep, params = text.rpartition("\nParameters: ")
    if not sep:
        return text
    return head + sep + EXAMPLE.sub("", params)


def stripped(sv: SourceVectors, texts: list[str], queries: list[str], embedder: Embedder) -> tuple[SourceVectors, int]:
    """``sv`` ranked on the tool texts without examples: changed tools embedded again, BM25 redone."""
    new = [without_examples(t) for t in texts]
    changed = [i for i, (a, b) in enumerate(zip(texts, new, strict=True)) if a != b]
    tools = sv.tools.copy()
    if changed:
        tools[changed] = embedder.embed_documents([new[i] for i in changed])
    return replace(sv, tools=tools, bm25=bm25_matrix(new, queries)), len(changed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA_ROOT)
    ap.add_argument("--vectors-cache", type=Path, default=Path("data/corpus_vectors"))
    ap.add_argument("--max-queries", type=int, default=400)
    ap.add_argument("--max-tools", type=int, default=1000)
    ap.add_argument("--fold-workdir", type=Path, default=None)
    args = ap.parse_args()
    minilm = load_minilm(Settings().resolved_embedder_cache())
    corpus = load_corpus(args.data, max_queries=args.max_queries, max_tools=args.max_tools, extra=[MCP_SOURCE])
    base = corpus_vectors(corpus, minilm, args.vectors_cache, lambda m: None)
    models = ["minilm"] + (["held-out fine-tune"] if args.fold_workdir else [])
    results: dict[str, tuple[list[SourceScore], list[SourceScore]]] = {m: ([], []) for m in models}
    print("| source | tools changed | model | found@1 with / without | found@5 with / without | multi recall@5 with / without |")
    print("|---|---:|---|---|---|---|")
    for ds, sv in zip(corpus, base, strict=True):
        texts, queries = tool_texts(ds.tools), [q.query for q in ds.queries]
        for model in models:
            vectors = sv if model == "minilm" else held_out_vectors(args.fold_workdir, sv)
            if vectors is None:  # no finished fold held this source out
                continue
            embedder = minilm if model == "minilm" else held_out_embedder(args.fold_workdir, sv.name, threads=1)
            after, n_changed = stripped(vectors, texts, queries, embedder)
            a, b = score_source(vectors, None, HYBRID_ALPHA), score_source(after, None, HYBRID_ALPHA)
            results[model][0].append(a)
            results[model][1].append(b)
            r5 = f"{100 * a.recall_at_5_multi:.1f} / {100 * b.recall_at_5_multi:.1f}" if a.n_multi else "-"
            print(f"| {ds.name} | {n_changed} | {model} | {100 * a.found_at_1:.1f} / {100 * b.found_at_1:.1f} "
                  f"({100 * (b.found_at_1 - a.found_at_1):+.1f}) | {100 * a.found_at_5:.1f} / {100 * b.found_at_5:.1f} | {r5} |",
                  flush=True)
    for model, (with_, without) in results.items():
        if not with_:
            continue
        p, q = pooled(with_), pooled(without)
        worst = min(zip(with_, without, strict=True), key=lambda ab: ab[1].found_at_1 - ab[0].found_at_1)
        print(f"| **pooled** | | {model} | {100 * p['found_at_1']:.1f} / {100 * q['found_at_1']:.1f} "
              f"({100 * (q['found_at_1'] - p['found_at_1']):+.1f}; worst {worst[0].source} "
              f"{100 * (worst[1].found_at_1 - worst[0].found_at_1):+.1f}) | {100 * p['found_at_5']:.1f} / "
              f"{100 * q['found_at_5']:.1f} | {100 * p['recall_at_5_multi']:.1f} / {100 * q['recall_at_5_multi']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
