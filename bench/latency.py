"""Latency of POST /shortlist against the real server over loopback (not a test).

    python bench/latency.py                                  # demo registry, demo-style queries
    python bench/latency.py --data ../shared/data/bfcl_simple --requests 2000

Starts `shortlist serve` on a free port with a fresh data directory, uploads the registry,
warms up, then sends requests one at a time and prints p50/p95/p99 and requests/s. In the same
run it times the in-process ONNX query embedding (the floor of the pipeline) for comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_EMBEDDER_CACHE, ROOT, serve  # noqa: E402

DEFAULT_QUERIES = [
    "What's the weather like in Paris right now?",
    "convert 100 dollars to euros",
    "email the quarterly report to bob@example.com",
    "book me a flight from JFK to LAX next friday",
    "what is 10 factorial",
    "open a GitHub issue about the login crash",
    "remind me to call mum at 6pm",
    "find a sushi place near the office",
]


def percentiles(samples: list[float]) -> str:
    arr = np.array(samples) * 1000
    return " ".join(f"p{p}={np.percentile(arr, p):.2f}ms" for p in (50, 95, 99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="data dir with tools.json + queries.jsonl")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--policy", default=None)
    parser.add_argument("--scorer", default=None)
    parser.add_argument("--embedder-cache", type=Path, default=DEFAULT_EMBEDDER_CACHE)
    args = parser.parse_args()

    if args.data:
        tools = json.loads((args.data / "tools.json").read_text())
        queries = [json.loads(line)["query"] for line in open(args.data / "queries.jsonl")][:500]
    else:
        tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())
        queries = DEFAULT_QUERIES

    from registry.index.embed import load_minilm

    embedder = load_minilm(args.embedder_cache)
    for q in queries[:20]:
        embedder.embed_query(q)
    floor = []
    for i in range(args.requests):
        t0 = time.perf_counter()
        embedder.embed_query(queries[i % len(queries)])
        floor.append(time.perf_counter() - t0)

    with serve(args.embedder_cache) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        t0 = time.perf_counter()
        client.put("/registries/bench", json=tools).raise_for_status()
        upload = time.perf_counter() - t0
        body: dict = {"registry": "bench"}
        if args.policy:
            body["policy"] = args.policy
        if args.scorer:
            body["scorer"] = args.scorer
        for q in queries[:50]:
            client.post("/shortlist", json={**body, "query": q}).raise_for_status()
        latencies, ks = [], []
        started = time.perf_counter()
        for i in range(args.requests):
            t0 = time.perf_counter()
            r = client.post("/shortlist", json={**body, "query": queries[i % len(queries)]})
            latencies.append(time.perf_counter() - t0)
            r.raise_for_status()
            ks.append(r.json()["k"])
        elapsed = time.perf_counter() - started

    n_tools = len(tools["tools"] if isinstance(tools, dict) else tools)
    print(f"registry: {n_tools} tools, upload+index {upload:.2f}s; {args.requests} requests, concurrency 1")
    print(f"POST /shortlist      {percentiles(latencies)}  {args.requests / elapsed:.0f} req/s  mean k={statistics.mean(ks):.2f}")
    print(f"embed-only (floor)   {percentiles(floor)}")
    print(f"ratio p50 shortlist / p50 embed-only: {np.percentile(latencies, 50) / np.percentile(floor, 50):.2f}")


if __name__ == "__main__":
    main()
