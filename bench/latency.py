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
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentiles(samples: list[float]) -> str:
    arr = np.array(samples) * 1000
    return " ".join(f"p{p}={np.percentile(arr, p):.2f}ms" for p in (50, 95, 99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="data dir with tools.json + queries.jsonl")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--policy", default=None)
    parser.add_argument("--scorer", default=None)
    parser.add_argument("--embedder-cache", type=Path, default=ROOT / "data" / "cache" / "embedder")
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

    port = free_port()
    with tempfile.TemporaryDirectory() as data_dir:
        env = dict(
            os.environ,
            SHORTLIST_PORT=str(port),
            SHORTLIST_DATA_DIR=data_dir,
            SHORTLIST_EMBEDDER_CACHE_DIR=str(args.embedder_cache),
            SHORTLIST_DEMO_REGISTRY="",
            HF_HUB_OFFLINE="1",
        )
        server = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--log-level", "warning"], env=env, cwd=ROOT
        )
        try:
            url = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=url, timeout=120) as client:
                for _ in range(600):
                    try:
                        if client.get("/readyz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    time.sleep(0.2)
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
        finally:
            server.terminate()
            server.wait(30)

    n_tools = len(tools["tools"] if isinstance(tools, dict) else tools)
    print(f"registry: {n_tools} tools, upload+index {upload:.2f}s; {args.requests} requests, concurrency 1")
    print(f"POST /shortlist      {percentiles(latencies)}  {args.requests / elapsed:.0f} req/s  mean k={statistics.mean(ks):.2f}")
    print(f"embed-only (floor)   {percentiles(floor)}")
    print(f"ratio p50 shortlist / p50 embed-only: {np.percentile(latencies, 50) / np.percentile(floor, 50):.2f}")


if __name__ == "__main__":
    main()
