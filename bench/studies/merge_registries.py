"""Pool several labelled data sets into one registry (training data for a registry-agnostic policy).

    python bench/studies/merge_registries.py ../shared/data/bfcl_simple ../shared/data/metatool \\
        --max-queries 0 2000 --out data/merged/bfcl+meta

The merged registry holds every tool of every set (names must not collide; they do not across
BFCL / MetaTool / StableToolBench) and every query, each keeping its own gold. Ranking a query
against the pooled registry gives a larger N and out-of-domain distractors at the same time,
which a policy meant for registries it never saw has to cope with. ``--max-queries`` samples
each set exactly as ``shortlist train/evaluate --max-queries`` do (``random.Random(0)``); 0 = all.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from registry.offline.datasets import load_dataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", nargs="+", type=Path)
    ap.add_argument("--max-queries", nargs="*", type=int, default=None, help="per data set; 0 = all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    limits = args.max_queries or [0] * len(args.data)
    if len(limits) != len(args.data):
        raise SystemExit("--max-queries needs one value per data set")
    tools: list[dict] = []
    names: set[str] = set()
    queries: list[dict] = []
    for directory, limit in zip(args.data, limits):
        for tool in json.loads((directory / "tools.json").read_text()):
            name = tool.get("name") or tool.get("function", {}).get("name")
            if name in names:
                raise SystemExit(f"tool name {name!r} occurs in more than one data set")
            names.add(name)
            tools.append(tool)
        rows = [json.loads(line) for line in (directory / "queries.jsonl").read_text().splitlines() if line.strip()]
        if limit:
            data = load_dataset(directory)  # the same sample score_table() draws
            if len(data.queries) > limit:
                keep = {q.id for q in random.Random(args.seed).sample(data.queries, limit)}
                rows = [r for r in rows if r["id"] in keep]
        queries += rows
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tools.json").write_text(json.dumps(tools))
    (args.out / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    print(f"{args.out}: {len(tools)} tools, {len(queries)} queries")


if __name__ == "__main__":
    main()
