"""Latency of POST /shortlist against the real server over loopback (not a test).

    python bench/latency.py                                  # demo registry, demo-style queries
    python bench/latency.py --data ../shared/data/bfcl_simple --requests 2000
    python bench/latency.py --data ../shared/data/toolbench_stable --max-tools 500 --baseline aa12855
    python bench/latency.py --data ../shared/data/toolbench_stable --max-tools 500 --embedder minilm-int8
    python bench/latency.py --fields --allowed-tools 'get_*' 'filesystem/*' --queries-per-call 4

Starts `shortlist serve` on a free port with a fresh data directory, uploads the registry,
warms up, then sends requests one at a time and prints p50/p95/p99 and requests/s. In the same
run it times the in-process ONNX query embedding (the floor of the pipeline) for comparison.
With ``--baseline REV`` the same requests also go to a server of that git revision (a temporary
worktree), in alternating rounds, so before and after share the machine's noise. With
``--fields`` one server answers, in alternating rounds, plain requests, the same requests with
``allowed_tools`` and calls of ``--queries-per-call`` requests each (``queries``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_EMBEDDER_CACHE, ROOT, serve, worktree

from registry.settings import EMBEDDERS, Settings

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
    parser.add_argument("--max-tools", type=int, default=None, help="first N tools of --data only")
    parser.add_argument("--queries", type=Path, help="queries.jsonl to send instead of --data's")
    parser.add_argument("--baseline", help="git revision to measure in the same run (before/after)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds with --baseline")
    parser.add_argument("--fields", action="store_true", help="plain vs allowed_tools vs queries, one server")
    parser.add_argument("--allowed-tools", nargs="+", default=["get_*", "filesystem/*"])
    parser.add_argument("--queries-per-call", type=int, default=4)
    parser.add_argument(
        "--query-cache", type=int, default=0,
        help="SHORTLIST_QUERY_CACHE_SIZE of the measured server (default 0: every query embedded)",
    )
    parser.add_argument(
        "--embedder", choices=EMBEDDERS, default=Settings().embedder,
        help="SHORTLIST_EMBEDDER of the measured server (and floor); default: the service's",
    )
    args = parser.parse_args()

    if args.data:
        tools = json.loads((args.data / "tools.json").read_text())
        if args.max_tools:
            tools = tools[: args.max_tools]
        queries = [json.loads(line)["query"] for line in (args.data / "queries.jsonl").read_text().splitlines()][:500]
    else:
        tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())
        queries = DEFAULT_QUERIES
    if args.queries:
        queries = [json.loads(line)["query"] for line in Path(args.queries).read_text().splitlines()][:500]
    if args.baseline:
        compare(args, tools, queries)
        return
    if args.fields:
        compare_fields(args, tools, queries)
        return

    from registry.index.embedders import default_embedder

    embedder = default_embedder(Settings(embedder=args.embedder, embedder_cache_dir=args.embedder_cache))
    for q in queries[:20]:
        embedder.embed_query(q)
    floor = []
    for i in range(args.requests):
        t0 = time.perf_counter()
        embedder.embed_query(queries[i % len(queries)])
        floor.append(time.perf_counter() - t0)

    with serve(
        args.embedder_cache, query_cache_size=str(args.query_cache), embedder=args.embedder
    ) as server:
        run = timed_requests(server.url, tools, queries, request_body(args), args.requests)
    latencies, ks, upload, elapsed = run.latencies, run.ks, run.upload, run.elapsed

    n_tools = len(tools["tools"] if isinstance(tools, dict) else tools)
    print(f"registry: {n_tools} tools, upload+index {upload:.2f}s; {args.requests} requests, concurrency 1")
    print(f"POST /shortlist      {percentiles(latencies)}  {args.requests / elapsed:.0f} req/s  mean k={statistics.mean(ks):.2f}")
    print(f"embed-only (floor)   {percentiles(floor)}")
    print(f"ratio p50 shortlist / p50 embed-only: {np.percentile(latencies, 50) / np.percentile(floor, 50):.2f}")


def request_body(args: argparse.Namespace) -> dict:
    body: dict = {"registry": "bench"}
    if args.policy:
        body["policy"] = args.policy
    if args.scorer:
        body["scorer"] = args.scorer
    return body


@dataclass
class Run:
    latencies: list[float]
    ks: list[int]
    upload: float  # seconds to upload and index the registry
    elapsed: float  # seconds for the timed requests


def _asked(body: dict, queries: list[str], i: int, per_call: int) -> dict:
    """Request ``i``: its query, or ``per_call`` consecutive ones as ``queries``."""
    if per_call <= 1:
        return {**body, "query": queries[i % len(queries)]}
    return {**body, "queries": [queries[(i + j) % len(queries)] for j in range(per_call)]}


def timed_requests(
    url: str, tools: object, queries: list[str], body: dict, n: int, per_call: int = 1
) -> Run:
    """Upload the registry, warm up on 50 queries, then time ``n`` requests one at a time."""
    with httpx.Client(base_url=url, timeout=120) as client:
        t0 = time.perf_counter()
        client.put("/registries/bench", json=tools).raise_for_status()
        upload = time.perf_counter() - t0
        for i in range(50):
            client.post("/shortlist", json=_asked(body, queries, i, per_call)).raise_for_status()
        latencies, ks = [], []
        started = time.perf_counter()
        for i in range(n):
            t0 = time.perf_counter()
            r = client.post("/shortlist", json=_asked(body, queries, i, per_call))
            latencies.append(time.perf_counter() - t0)
            r.raise_for_status()
            ks.append(r.json()["k"])
    return Run(latencies, ks, upload, time.perf_counter() - started)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (Linux ``/proc``): what a request costs the
    server, far steadier than wall time on a loaded machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare(args: argparse.Namespace, tools: object, queries: list[str]) -> None:
    """Baseline revision vs this checkout, alternating rounds of ``--requests`` each."""
    body = request_body(args)
    results: dict[str, tuple[list[float], list[int]]] = {"baseline": ([], []), "current": ([], [])}
    cpu = {"baseline": 0.0, "current": 0.0}  # server CPU seconds over the timed requests
    with (
        worktree(args.baseline) as base_root,
        serve(args.embedder_cache, root=base_root) as base,
        serve(args.embedder_cache, query_cache_size=str(args.query_cache), embedder=args.embedder) as cur,
    ):
        for _ in range(args.rounds):
            for label, server in (("baseline", base), ("current", cur)):
                before = cpu_seconds(server.pid)
                run = timed_requests(server.url, tools, queries, body, args.requests)
                cpu[label] += cpu_seconds(server.pid) - before  # the upload and warm-up too
                results[label][0].extend(run.latencies)
                results[label][1].extend(run.ks)
    n_tools = len(tools["tools"] if isinstance(tools, dict) else tools)  # type: ignore[index, arg-type]
    print(f"registry: {n_tools} tools; {args.rounds} alternating rounds of {args.requests} requests each")
    for label, (latencies, ks) in results.items():
        name = f"{label} ({args.baseline})" if label == "baseline" else "current (working tree)"
        per_call = cpu[label] * 1000 / (len(latencies) + 50 * args.rounds)
        print(f"{name:32} {percentiles(latencies)}  mean k={statistics.mean(ks):.2f}  "
              f"server CPU {per_call:.2f} ms/call (upload and warm-up included)")
    delta = np.percentile(results["current"][0], 50) - np.percentile(results["baseline"][0], 50)
    print(f"p50 change: {delta * 1000:+.2f} ms")


def compare_fields(args: argparse.Namespace, tools: object, queries: list[str]) -> None:
    """Plain requests vs ``allowed_tools`` vs ``queries`` on one server, alternating rounds."""
    body = request_body(args)
    kinds = {
        "plain": (body, 1),
        f"allowed_tools {args.allowed_tools}": ({**body, "allowed_tools": args.allowed_tools}, 1),
        f"queries ({args.queries_per_call} a call)": (body, args.queries_per_call),
    }
    results: dict[str, tuple[list[float], list[int]]] = {kind: ([], []) for kind in kinds}
    with serve(args.embedder_cache, query_cache_size=str(args.query_cache), embedder=args.embedder) as server:
        for _ in range(args.rounds):
            for kind, (sent, per_call) in kinds.items():
                run = timed_requests(server.url, tools, queries, sent, args.requests, per_call)
                results[kind][0].extend(run.latencies)
                results[kind][1].extend(run.ks)
    print(f"{args.rounds} alternating rounds of {args.requests} calls each, one server")
    for kind, (latencies, ks) in results.items():
        print(f"{kind:44} {percentiles(latencies)}  mean k={statistics.mean(ks):.2f}")


if __name__ == "__main__":
    main()
