"""Latency, throughput, per-stage time and RSS of the real server (issue: fast and hard to break).

    python bench/perf.py --data-root ../shared/data [--sizes 500,4000,100000] [--duration 20]
    python bench/perf.py --sizes 500,4000 --embedders minilm,minilm-int8 --cache-hit --peer \
        --quality bfcl_simple,metatool,toolbench_stable          # issue 15, one run

For each registry size N it starts `shortlist serve` on a free loopback port with a fresh data
directory, uploads a registry (real tools from BFCL, MetaTool and StableToolBench, topped up
with synthetic tools for large N), times the initial indexing, a re-upload of the same tools
and a one-tool upsert, then drives POST /shortlist with wrk (a bounded, fixed-duration load
generator from Debian's `wrk` package) at concurrency 1 and 8 with real queries. It prints
p50/p95/p99, requests/s and errors from wrk, the mean time per stage (embed/search/policy/total)
from the service's own histograms, and the server's RSS. In the same run it measures the
embed-only floor (the ONNX embedder called in-process on the same queries) and prints
p50(/shortlist) / p50(embed-only).

Issue 15 rows, all in the same run: every size for each ``--embedders`` (SHORTLIST_EMBEDDER,
each with its own floor); ``--cache-hit``: the first size with the query cache on and every
query sent once before the load (so each timed request is a hit); ``--peer``: the in-process
MiniLM + FAISS top-k a LangGraph bigtool user would write (:class:`BigtoolStyleRetriever` below), same queries;
``--quality``: hybrid found@1 of fp32 and int8 on those dev sets.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    DEFAULT_EMBEDDER_CACHE,
    ROOT,
    real_queries,
    real_tools,
    rss_mib,
    serve,
    synthetic_tools,
)


def stage_means(before: str, after: str) -> dict[str, float]:
    def totals(text: str) -> dict[tuple[str, str], float]:
        out = {}
        for family in text_string_to_metric_families(text):
            if family.name == "shortlist_request_duration_seconds":
                for s in family.samples:
                    if s.name.endswith(("_sum", "_count")):
                        out[(s.labels["stage"], s.name.rsplit("_", 1)[1])] = s.value
        return out

    b, a = totals(before), totals(after)
    means = {}
    for stage in ("embed", "search", "policy", "total"):
        count = a.get((stage, "count"), 0) - b.get((stage, "count"), 0)
        total = a.get((stage, "sum"), 0) - b.get((stage, "sum"), 0)
        means[stage] = 1000 * total / count if count else float("nan")
    return means


WRK_SCRIPT = textwrap.dedent("""
    local bodies = {}
    local i = 0
    init = function(args)
      for line in io.lines(args[1]) do bodies[#bodies + 1] = line end
    end
    request = function()
      i = i % #bodies + 1
      return wrk.format("POST", "/shortlist", {["Content-Type"] = "application/json"}, bodies[i])
    end
    done = function(summary, latency, requests)
      local errors = summary.errors.connect + summary.errors.read + summary.errors.write
        + summary.errors.status + summary.errors.timeout
      io.write(string.format("RESULT %d %d %.1f %.1f %.1f %.1f\\n", summary.requests, errors,
        latency:percentile(50), latency:percentile(95), latency:percentile(99),
        summary.requests / (summary.duration / 1e6)))
    end
""")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_wrk(url: str, bodies: Path, script: Path, concurrency: int, duration: int) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t", str(min(concurrency, 2)), "-c", str(concurrency), "-d", f"{duration}s",
         "--timeout", "5s", "-s", str(script), url, "--", str(bodies)],
        capture_output=True, text=True, check=True,
    ).stdout
    match = re.search(r"RESULT (\d+) (\d+) ([\d.]+) ([\d.]+) ([\d.]+) ([\d.]+)", out)
    assert match, out
    n, errors, p50, p95, p99, rps = match.groups()
    return {"requests": int(n), "errors": int(errors), "p50": float(p50) / 1000, "p95": float(p95) / 1000,
            "p99": float(p99) / 1000, "rps": float(rps)}


def embed_floor(queries: list[str], cache: Path, embedder_name: str = "minilm", n: int = 600) -> float:
    from registry.index.embedders import load_minilm

    embedder = load_minilm(cache, embedder=embedder_name)  # type: ignore[arg-type]
    for q in queries[:50]:
        embedder.embed_query(q)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        embedder.embed_query(queries[i % len(queries)])
        times.append(time.perf_counter() - t0)
    return float(np.percentile(times, 50) * 1000)


def write(client: httpx.Client, method: str, url: str, body: object) -> None:
    """A registry write, waited for: a large one answers 202 with a job to poll until done."""
    r = client.request(method, url, json=body)
    r.raise_for_status()
    if r.status_code == 202:
        job = r.headers.get("Location") or f"/registries/bench/jobs/{r.json()['job']}"
        while (state := client.get(job).json())["state"] in ("queued", "running"):
            time.sleep(0.05)
        if state["state"] != "done":
            raise RuntimeError(f"write job failed: {state}")


def bench_size(n_tools: int, tools: list[dict], queries: list[str], args, workdir: Path,
               embedder: str = "minilm", cache_hit: bool = False) -> dict:
    result: dict = {"n": n_tools, "embedder": embedder, "cache_hit": cache_hit}
    data_dir = workdir / f"data-{n_tools}"
    with serve(args.embedder_cache, data_dir=data_dir, embedder=embedder,
               query_cache_size=str(10_000 if cache_hit else 0),
               max_tools_per_registry=str(max(50_000, n_tools + 1))) as server, \
            httpx.Client(base_url=server.url, timeout=3600) as client:
        t0 = time.perf_counter()
        write(client, "PUT", "/registries/bench", tools)
        result["index_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        write(client, "PUT", "/registries/bench", tools)
        result["reupload_s"] = time.perf_counter() - t0
        one = {"name": "bench_upserted_tool", "description": "A tool added by the benchmark to time upserts."}
        t0 = time.perf_counter()
        write(client, "POST", "/registries/bench/tools", [one])
        result["upsert_s"] = time.perf_counter() - t0
        bodies = workdir / "bodies.jsonl"
        bodies.write_text("".join(json.dumps({"registry": "bench", "query": q}) + "\n" for q in queries))
        script = workdir / "shortlist.lua"
        script.write_text(WRK_SCRIPT)
        for q in queries if cache_hit else queries[:100]:  # warm-up (with the cache: every query)
            client.post("/shortlist", json={"registry": "bench", "query": q}).raise_for_status()
        for concurrency in args.concurrency:
            before, cpu = client.get("/metrics").text, cpu_seconds(server.pid)
            load = run_wrk(server.url, bodies, script, concurrency, args.duration)
            # server CPU per request: less sensitive than wall time to other work on the machine
            load["cpu_ms"] = 1000 * (cpu_seconds(server.pid) - cpu) / max(1, load["requests"])
            after = client.get("/metrics").text
            result[f"c{concurrency}"] = {**load, "stages": stage_means(before, after)}
        result["rss_mb"] = rss_mib(server.pid)
    shutil.rmtree(data_dir, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--sizes", default="500,4000,100000")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--duration", type=int, default=20, help="seconds of load per concurrency")
    parser.add_argument("--embedder-cache", type=Path, default=DEFAULT_EMBEDDER_CACHE)
    parser.add_argument("--embedders", default="minilm", help="SHORTLIST_EMBEDDER values, comma-separated")
    parser.add_argument("--cache-hit", action="store_true", help="also the first size with every query a cache hit")
    parser.add_argument("--peer", action="store_true", help="also the in-process MiniLM + FAISS top-k baseline")
    parser.add_argument("--quality", default="", help="dev sets for fp32 vs int8 found@1 (hybrid), comma-separated")
    parser.add_argument("--max-queries", type=int, default=2000, help="per dev set, for --quality")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install -y wrk")

    embedders = args.embedders.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    queries = real_queries(args.data_root)
    floors = {name: embed_floor(queries, args.embedder_cache, name) for name in embedders}
    pool = real_tools(args.data_root)
    runs = [(e, n, False) for e in embedders for n in sizes]
    if args.cache_hit:
        runs.append((embedders[0], sizes[0], True))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for embedder, n, hit in runs:
            tools = pool[:n] + synthetic_tools(max(0, n - len(pool)))
            print(f"{embedder} N={n}{' cache hits' if hit else ''}: {min(n, len(pool))} real + "
                  f"{max(0, n - len(pool))} synthetic tools ...", flush=True)
            results.append(bench_size(n, tools, queries, args, Path(tmp), embedder, hit))
    peer = {n: peer_latency(args.embedder_cache, pool[:n] + synthetic_tools(max(0, n - len(pool))), queries)
            for n in sizes[:2]} if args.peer else {}
    found = quality(args.data_root, args.embedder_cache, args.quality.split(","), args.max_queries) \
        if args.quality else {}
    report(args, floors, results, peer, found)
    if args.json:
        args.json.write_text(json.dumps({"embed_floor_p50_ms": floors, "results": results, "peer": peer,
                                         "found_at_1": found}, indent=1))


def report(args, floors: dict[str, float], results: list[dict], peer: dict, found: dict) -> None:
    print("\nembed-only floor (ONNX MiniLM in-process, 1 thread), p50: "
          + ", ".join(f"{name} {ms:.2f} ms" for name, ms in floors.items()) + "\n")
    print("| embedder | N | conc. | p50 ms | p95 ms | p99 ms | req/s | errors | embed | search | policy | "
          "total (ms, mean) | p50 / floor | server CPU ms/req |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        label = r["embedder"] + (" (cache hit)" if r["cache_hit"] else "")
        for c in args.concurrency:
            x = r[f"c{c}"]
            s = x["stages"]
            print(f"| {label} | {r['n']} | {c} | {x['p50']:.2f} | {x['p95']:.2f} | {x['p99']:.2f} | {x['rps']:.0f} | "
                  f"{x['errors']} | {s['embed']:.2f} | {s['search']:.2f} | {s['policy']:.2f} | {s['total']:.2f} | "
                  f"{x['p50'] / floors[r['embedder']]:.2f} | {x['cpu_ms']:.2f} |")
    for n, x in peer.items():
        print(f"| peer: in-process MiniLM fp32 + FAISS top-{5}, no HTTP | {n} | 1 | {x['p50']:.2f} | {x['p95']:.2f} | "
              f"{x['p99']:.2f} | {x['qps']:.0f} | 0 | | | | | {x['p50'] / floors.get('minilm', float('nan')):.2f} | "
              f"{x['cpu_ms']:.2f} |")
    print("\n| embedder | N | initial indexing s | re-upload s | upsert 1 tool s | server RSS MB |")
    print("|---|---|---|---|---|---|")
    for r in results:
        if not r["cache_hit"]:
            print(f"| {r['embedder']} | {r['n']} | {r['index_s']:.2f} | {r['reupload_s']:.2f} | "
                  f"{r['upsert_s']:.3f} | {r['rss_mb']:.0f} |")
    if found:
        print("\n| dev set | queries | found@1 fp32 % | found@1 int8 % | int8 - fp32 (points) |")
        print("|---|---|---|---|---|")
        for name, row in found.items():
            a, b = 100 * row["minilm"], 100 * row["minilm-int8"]
            print(f"| {name} | {row['n']:.0f} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")


# -- --peer and --quality: the in-process peer and the int8 quality check -------------------------
#
# What this script compares the service with, and the int8 quality check (issue 15).
#
# * :func:`peer_latency`: the peer baseline, what a LangGraph bigtool user would write in-process:
#   the same all-MiniLM-L6-v2 ONNX fp32 file through onnxruntime + tokenizers (mean-pooled and
#   normalised inside the graph), tool vectors in a FAISS ``IndexFlatIP``, one top-k search per
#   query. No HTTP, no validation, no depth policy, no hybrid scorer: the floor of "embed + search".
# * :func:`found_at_1`: hybrid-scorer found@1 of an embedder on a dev set, computed by the
#   project's own evaluation pipeline (``score_table -> rank_table -> evaluate_ranked``, as
#   ``shortlist evaluate`` does).

PEER_K = 5


class BigtoolStyleRetriever:
    """Minimal in-process MiniLM + FAISS top-k, written the way a library user would.

    Args:
        onnx_path: the fp32 MiniLM export (inputs ids/mask/types, output ``sentence_embedding``).
        tokenizer_path: its ``tokenizer.json``.
        tool_texts: one text per tool (name + description), indexed once.
        threads: onnxruntime intra-op threads (1, like one request of the service).
    """

    def __init__(
        self, onnx_path: Path, tokenizer_path: Path, tool_texts: Sequence[str], threads: int = 1
    ) -> None:
        import faiss
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=256)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(onnx_path), options, providers=["CPUExecutionProvider"]
        )
        vectors = np.concatenate([self.embed(text) for text in tool_texts])
        self.index = faiss.IndexFlatIP(vectors.shape[1])
        self.index.add(vectors)

    def embed(self, text: str) -> np.ndarray:
        enc = self.tokenizer.encode(text)
        feeds = {
            "input_ids": np.array([enc.ids], dtype=np.int64),
            "attention_mask": np.array([enc.attention_mask], dtype=np.int64),
            "token_type_ids": np.array([enc.type_ids], dtype=np.int64),
        }
        return np.asarray(self.session.run(None, feeds)[0], dtype=np.float32)

    def top_k(self, query: str, k: int = PEER_K) -> list[int]:
        _, ids = self.index.search(self.embed(query), k)
        return [int(i) for i in ids[0]]


def tool_text(tool: dict) -> str:
    return f"{tool.get('name', '')}: {tool.get('description', '')}"


def peer_latency(
    embedder_cache: Path, tools: list[dict], queries: list[str], n: int = 1000
) -> dict[str, float]:
    """p50/p95/p99 (ms) and queries/s of :class:`BigtoolStyleRetriever` on one thread."""
    from registry.index.embed import MINILM_NAME, ONNX_FILE, TOKENIZER_FILE

    folder = embedder_cache / MINILM_NAME
    retriever = BigtoolStyleRetriever(
        folder / ONNX_FILE, folder / TOKENIZER_FILE, [tool_text(t) for t in tools]
    )
    for q in queries[:50]:
        retriever.top_k(q)
    times = []
    cpu = time.process_time()
    started = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        retriever.top_k(queries[i % len(queries)])
        times.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    cpu_ms = 1000 * (time.process_time() - cpu) / n
    ms = np.array(times) * 1000
    return {
        "p50": float(np.percentile(ms, 50)),
        "p95": float(np.percentile(ms, 95)),
        "p99": float(np.percentile(ms, 99)),
        "qps": n / elapsed,
        "cpu_ms": cpu_ms,
    }


def found_at_1(data_dir: Path, embedder: object, max_queries: int | None) -> float:
    """Hybrid-scorer found@1 (share of queries whose top tool is gold) on one dev set."""
    from registry.offline.evaluate import evaluate_ranked
    from registry.offline.score_tables import score_table
    from registry.offline.tables import rank_table

    table = score_table(data_dir, embedder, max_queries=max_queries)  # type: ignore[arg-type]
    return float(evaluate_ranked(rank_table(table, "hybrid"), {})["found_at"]["1"])


def quality(
    data_root: Path, embedder_cache: Path, sets: Sequence[str], max_queries: int | None
) -> dict[str, dict[str, float]]:
    """found@1 of fp32 and int8 per dev set: ``{set: {"minilm": x, "minilm-int8": y, "n": q}}``."""
    from registry.index.embedders import load_minilm

    out: dict[str, dict[str, float]] = {}
    embedders = {name: load_minilm(embedder_cache, embedder=name) for name in ("minilm", "minilm-int8")}  # type: ignore[arg-type]
    for name in sets:
        lines = (data_root / name / "queries.jsonl").read_text().splitlines()
        row: dict[str, float] = {"n": float(min(len(lines), max_queries or len(lines)))}
        for label, embedder in embedders.items():
            row[label] = found_at_1(data_root / name, embedder, max_queries)
        out[name] = row
        print(f"found@1 {name}: {json.dumps(row)}", flush=True)
    return out


if __name__ == "__main__":
    main()
