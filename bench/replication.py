"""Replication lag between replicas sharing Redis, and the memory of one replica (not a test).

    python bench/replication.py                       # 4,000-tool registry, 20 trials each
    python bench/replication.py --tools 4000 --trials 20 --json bench/out/replication.json

Starts its own `redis-server` (no persistence) and two `shortlist serve` replicas A and B on
free loopback ports, both with SHORTLIST_REDIS_URL. Then:

1. uploads a registry of --tools tools to A (ToolBench tools from --toolbench, topped up with
   synthetic ones) and times how long B takes to serve it;
2. replication lag, small registry: PUT the 30-tool demo registry on A (alternating two
   variants so every PUT is a new version); lag = from A's 200 response until B's
   GET /registries shows the new version (polled every 2 ms);
3. replication lag, large registry: upsert one tool into the big registry on A; B rebuilds the
   whole snapshot (parse, BM25, FAISS) from Redis, embeddings from the shared cache;
4. RSS (VmRSS) of both replicas: idle, after the big registry is loaded, after 500 queries.

Prints a Markdown summary; --json writes every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Server, redis_server, rss_mib

ROOT = Path(__file__).resolve().parent.parent
QUERIES = [
    "What's the weather like in Paris right now?",
    "find upcoming concerts for my favourite band",
    "convert 100 dollars to euros",
    "get the latest stock price for AAPL",
    "search for recipes with chicken and rice",
    "translate this sentence into Spanish",
    "look up the lyrics of a song",
    "show me football match results from yesterday",
]


def served_version(server: Server, registry: str) -> int | None:
    body = httpx.get(f"{server.url}/registries", timeout=5).json()
    return next((r["version"] for r in body["registries"] if r["registry"] == registry), None)


def big_registry(n: int, toolbench: Path | None) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    if toolbench is not None and toolbench.is_file():
        tools = json.loads(toolbench.read_text())[:n]
    topics = ["invoice", "weather", "calendar", "payment", "ticket", "shipment", "playlist",
              "recipe", "account", "sensor", "contract", "flight", "hotel", "stock", "lyrics"]
    verbs = ["get", "list", "create", "update", "delete", "search", "export", "validate"]
    i = 0
    while len(tools) < n:
        topic, verb = topics[i % len(topics)], verbs[(i // len(topics)) % len(verbs)]
        tools.append({
            "name": f"synthetic_{verb}_{topic}_{i}",
            "description": f"{verb.capitalize()} a {topic} record in service {i % 97} "
                           f"(region {i % 13}, tier {i % 5}).",
            "parameters": {"type": "object", "properties": {
                f"{topic}_id": {"type": "string", "description": f"Identifier of the {topic}."},
                "limit": {"type": "integer", "description": "Most results to return."}}},
        })
        i += 1
    return tools


def lag(a: Server, b: Server, registry: str, write: Any, poll: float = 0.002) -> float:
    response = write()
    acked = time.perf_counter()
    response.raise_for_status()
    version = response.json()["version"]
    while served_version(b, registry) != version:
        if time.perf_counter() - acked > 30:
            raise TimeoutError(f"B never served version {version} of {registry}")
        time.sleep(poll)
    return time.perf_counter() - acked


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {"n": len(ms), "median_ms": statistics.median(ms), "p90_ms": ms[int(0.9 * (len(ms) - 1))],
            "max_ms": ms[-1], "min_ms": ms[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tools", type=int, default=4000)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--toolbench", type=Path, default=ROOT.parent / "shared" / "data" / "toolbench_stable" / "tools.json")
    parser.add_argument("--embedder-cache", type=Path, default=ROOT / "data" / "cache" / "embedder")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    demo = json.loads((ROOT / "examples" / "demo_tools.json").read_text())["tools"]
    variants = [demo, [dict(t, description=t.get("description", "") + " ") if "name" in t else t for t in demo]]
    big = big_registry(args.tools, args.toolbench)
    results: dict[str, Any] = {"tools": len(big), "trials": args.trials}

    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as redis_url:
        base = Path(tmp)
        a, b = (Server(args.embedder_cache, base / name, log_path=base / f"{name}.log", redis_url=redis_url)
                for name in ("a", "b"))
        try:
            a.wait_ready()
            b.wait_ready()
            time.sleep(1)
            results["rss_idle_mib"] = {"a": rss_mib(a.pid), "b": rss_mib(b.pid)}

            t0 = time.perf_counter()
            r = httpx.put(f"{a.url}/registries/big", json=big, timeout=1800)
            r.raise_for_status()
            results["upload_seconds"] = time.perf_counter() - t0  # A embeds every tool
            t1 = time.perf_counter()
            while served_version(b, "big") != 1:
                time.sleep(0.002)
            results["first_load_lag_seconds"] = time.perf_counter() - t1  # B: from Redis

            lags_small = [
                lag(a, b, "demo", lambda i=i: httpx.put(f"{a.url}/registries/demo", json=variants[i % 2], timeout=60))
                for i in range(args.trials)
            ]
            lags_big = [
                lag(a, b, "big", lambda i=i: httpx.post(
                    f"{a.url}/registries/big/tools",
                    json=[{"name": f"bench_extra_{i % 3}", "description": f"Extra tool, revision {i}.",
                           "parameters": {}}], timeout=120))
                for i in range(args.trials)
            ]
            results["lag_small"] = summary(lags_small)
            results["lag_big"] = summary(lags_big)
            results["lag_small_raw_ms"] = [round(x * 1000, 2) for x in lags_small]
            results["lag_big_raw_ms"] = [round(x * 1000, 2) for x in lags_big]
            results["rss_loaded_mib"] = {"a": rss_mib(a.pid), "b": rss_mib(b.pid)}
            for i in range(500):
                for replica in (a, b):
                    httpx.post(f"{replica.url}/shortlist",
                               json={"registry": "big", "query": QUERIES[i % len(QUERIES)]}).raise_for_status()
            results["rss_after_queries_mib"] = {"a": rss_mib(a.pid), "b": rss_mib(b.pid)}
            info = redis.Redis.from_url(redis_url).info("memory")
            results["redis_used_memory_mib"] = info["used_memory"] / 2**20
        finally:
            a.stop(kill=True)
            b.stop(kill=True)

    s, g = results["lag_small"], results["lag_big"]
    print(f"registry: {results['tools']} tools; upload to A {results['upload_seconds']:.1f} s "
          f"(embedding), B serving it {results['first_load_lag_seconds'] * 1000:.0f} ms later")
    print()
    print("| replication lag (PUT ack on A -> B serves it) | trials | median | p90 | max |")
    print("|---|---|---|---|---|")
    print(f"| 30-tool registry, PUT | {s['n']} | {s['median_ms']:.0f} ms | {s['p90_ms']:.0f} ms | {s['max_ms']:.0f} ms |")
    print(f"| {results['tools']}-tool registry, upsert one tool | {g['n']} | {g['median_ms']:.0f} ms | "
          f"{g['p90_ms']:.0f} ms | {g['max_ms']:.0f} ms |")
    print()
    print("| RSS (MiB) | A | B |")
    print("|---|---|---|")
    for key, label in (("rss_idle_mib", "idle, no registry"), ("rss_loaded_mib", f"{results['tools']}-tool registry loaded"),
                       ("rss_after_queries_mib", "after 500 queries each")):
        print(f"| {label} | {results[key]['a']:.0f} | {results[key]['b']:.0f} |")
    print(f"\nRedis used_memory: {results['redis_used_memory_mib']:.1f} MiB")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
