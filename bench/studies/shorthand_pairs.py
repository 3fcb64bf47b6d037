"""Shorthand against spelled-out requests: does "open a PR" find what "open a pull request" finds?

Each row of ``tests/fixtures/shorthand_pairs.jsonl`` names a registry (a harvested MCP
``tools/list`` or the demo registry), an abbreviated request, the same request spelled out and
the tool both need. Every request is ranked by the service's hybrid scorer (cosine + 0.8 BM25
over the registry's tool texts) three ways: the spelled-out request, the abbreviated one as
typed (today's path before :mod:`registry.serving.shorthand`) and the abbreviated one expanded
by :func:`registry.serving.shorthand.expand_shorthand`. Printed: found@1 and found@3 of the
needed tool, and how often the abbreviated request's top tool is the spelled-out one's::

    python bench/studies/shorthand_pairs.py [--embedder tuned] [--json docs/generated/shorthand_pairs.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from registry.index.embedders import load_minilm
from registry.index.hybrid import HYBRID_ALPHA, fuse
from registry.index.lexical import LexicalIndex, tokenize
from registry.serving.shorthand import expand_shorthand
from registry.settings import Settings
from registry.tools import parse_tools

ROOT = Path(__file__).resolve().parents[2]
PAIRS = ROOT / "tests" / "fixtures" / "shorthand_pairs.jsonl"


def rankings(pairs: list[dict], embedder) -> list[dict[str, list[str]]]:
    """Per pair, the tool names best first for ``long``, ``short`` and ``expanded``."""
    out = []
    registries: dict[str, tuple[list[str], np.ndarray, LexicalIndex]] = {}
    for pair in pairs:
        if pair["registry"] not in registries:
            payload = json.loads((ROOT / pair["registry"]).read_text())
            tools = parse_tools({"tools": payload["tools"]})
            texts = [t.text() for t in tools]
            registries[pair["registry"]] = (
                [t.name for t in tools], embedder.embed_documents(texts), LexicalIndex(texts)
            )
        names, vectors, lexical = registries[pair["registry"]]
        row = {}
        for label, text in (("long", pair["long"]), ("short", pair["short"]),
                            ("expanded", expand_shorthand(pair["short"]))):
            tokens = tokenize(text)
            scores = fuse(vectors @ embedder.embed_query(text), lexical.scores(tokens),
                          lexical.ceiling(tokens), HYBRID_ALPHA)
            row[label] = [names[i] for i in np.argsort(-scores, kind="stable")]
        out.append(row)
    return out


def summary(pairs: list[dict], ranked: list[dict[str, list[str]]]) -> dict[str, dict[str, float]]:
    out = {}
    for label in ("long", "short", "expanded"):
        at1 = [r[label][0] == p["tool"] for p, r in zip(pairs, ranked, strict=True)]
        at3 = [p["tool"] in r[label][:3] for p, r in zip(pairs, ranked, strict=True)]
        same = [r[label][0] == r["long"][0] for r in ranked]
        out[label] = {"found_at_1": 100 * float(np.mean(at1)), "found_at_3": 100 * float(np.mean(at3)),
                      "same_top_as_long": 100 * float(np.mean(same))}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedder", default="tuned")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    settings = Settings()
    embedder = load_minilm(settings.resolved_embedder_cache(), embedder=args.embedder,
                           adapter_dir=settings.tuned_embedder_dir)
    pairs = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    ranked = rankings(pairs, embedder)
    figures = summary(pairs, ranked)
    print(f"{len(pairs)} pairs, embedder {embedder.model_id}, hybrid alpha {HYBRID_ALPHA}")
    print("| request | found@1 | found@3 | same top tool as spelled out |\n|---|---|---|---|")
    for label, f in figures.items():
        print(f"| {label} | {f['found_at_1']:.1f} | {f['found_at_3']:.1f} | {f['same_top_as_long']:.1f} |")
    for p, r in zip(pairs, ranked, strict=True):
        if r["expanded"][0] != p["tool"]:
            print(f"miss: {p['short']!r} -> {r['expanded'][:3]} (spelled out: {r['long'][:3]})")
    if args.json:
        args.json.write_text(json.dumps({"embedder": embedder.model_id, "pairs": len(pairs), **figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
