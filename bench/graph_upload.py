"""What reading the prerequisite graph costs a write, with and without it in one run.

    nice -n 10 python bench/graph_upload.py --tools 10000 --rounds 3

``--tools`` distinct tools pooled from ``../shared/data/train/*/tools.json`` (real schemas and
descriptions) are uploaded (``PUT``, a whole registry) into an in-process engine on a local
store, then one new tool is upserted ``--upserts`` times; each round once with the graph read as
the service does and once with :meth:`ToolGraph.build` replaced by an empty graph (today's
write path without it), alternating so both share the machine's noise. The embedder is the
hashing fake, so the times are parse + BM25 + FAISS + store write + graph: the real MiniLM
would add minutes of embedding to a 10,000-tool upload and make the graph's share far smaller;
this is its worst case. Printed: median seconds per upload and per one-tool upsert, and the
graph's share. ``--query-cost DATA``: what the graph adds to a query instead (in-process, the
hashing embedder, 500 tools of DATA, 200 of its queries, alternating rounds).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry.index.graph import ToolGraph  # noqa: E402
from registry.tools import ToolLimits, parse_tools  # noqa: E402

SHARED = ROOT.parent.parent / "shared" / "data" / "train"


def pooled_tools(n: int) -> list[dict[str, Any]]:
    tools: dict[str, dict[str, Any]] = {}
    for path in sorted(SHARED.glob("*/tools.json")):
        for tool in json.loads(path.read_text(encoding="utf-8")):
            name = tool.get("name") or tool.get("function", {}).get("name")
            if isinstance(name, str) and name not in tools:
                tools[name] = tool
            if len(tools) >= n:
                return list(tools.values())
    return list(tools.values())


def one_round(tools: list[dict[str, Any]], upserts: int, with_graph: bool) -> tuple[float, float, int]:
    from registry.assembly import Registries
    from registry.index.embed import HashingEmbedder
    from registry.serving.depth_policies import OnnxDepthPolicy
    from registry.settings import Settings
    from registry.store.local import LocalStore

    real_build = ToolGraph.build
    if not with_graph:
        ToolGraph.build = classmethod(lambda cls, *a, **k: ToolGraph())  # type: ignore[method-assign,assignment]
    try:
        with tempfile.TemporaryDirectory(prefix="graph-upload-") as tmp:
            settings = Settings(data_dir=Path(tmp), demo_registry=None, max_tools_per_registry=100_000)
            engine = Registries.build(settings, LocalStore(Path(tmp)), HashingEmbedder(),
                                     OnnxDepthPolicy.from_dir(ROOT / "models" / "default"))
            t0 = time.perf_counter()
            engine.writer.put_registry("big", tools)
            upload = time.perf_counter() - t0
            times = []
            for i in range(upserts):
                new = {"name": f"bench_new_{i}", "description": f"A new tool number {i}.",
                       "parameters": {"type": "object", "properties": {"item_id": {"type": "string"}},
                                      "required": ["item_id"]}}
                t1 = time.perf_counter()
                engine.writer.upsert_tools("big", [new])
                times.append(time.perf_counter() - t1)
            edges = len(engine.snapshots.snapshot("big").graph.edges)
    finally:
        ToolGraph.build = real_build  # type: ignore[method-assign]
    return upload, statistics.median(times), edges


def query_cost(data: Path, n_tools: int, n_queries: int, rounds: int) -> None:
    """``/shortlist``'s in-process time on ``n_tools`` tools of ``data`` with the registry's graph
    and with it emptied, alternating rounds (hashing embedder: the rest of the path, unmasked)."""
    from dataclasses import replace

    from registry.assembly import Registries
    from registry.index.embed import HashingEmbedder
    from registry.request import ShortlistRequest
    from registry.serving.depth_policies import OnnxDepthPolicy
    from registry.settings import Settings
    from registry.store.local import LocalStore

    tools = json.loads((data / "tools.json").read_text(encoding="utf-8"))[:n_tools]
    lines = (data / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    queries = [json.loads(line)["query"] for line in lines if line.strip()][:n_queries]
    with tempfile.TemporaryDirectory(prefix="graph-query-") as tmp:
        engine = Registries.build(Settings(data_dir=Path(tmp), demo_registry=None, explore_share=0.0),
                                 LocalStore(Path(tmp)), HashingEmbedder(),
                                 OnnxDepthPolicy.from_dir(ROOT / "models" / "default"))
        engine.writer.put_registry("r", tools)
        snap = engine.snapshots.snapshot("r")
        plain = replace(snap, graph=ToolGraph())
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):
            for with_graph in (False, True):
                engine.snapshots.install(snap if with_graph else plain)
                for query in queries:
                    t0 = time.perf_counter()
                    engine.shortlist(ShortlistRequest("r", query))
                    times[with_graph].append(time.perf_counter() - t0)
    for with_graph in (False, True):
        print(f"{'with graph' if with_graph else 'without graph':14} p50 {1000 * statistics.median(times[with_graph]):.3f} ms"
              f"  ({len(snap.graph.edges)} edges, {len(tools)} tools)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tools", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--upserts", type=int, default=10)
    ap.add_argument("--query-cost", type=Path, default=None, metavar="DATA",
                    help="instead: in-process /shortlist p50 on DATA's first 500 tools, with and without the graph")
    args = ap.parse_args()
    if args.query_cost is not None:
        query_cost(args.query_cost, 500, 200, args.rounds)
        return
    tools = pooled_tools(args.tools)
    print(f"{len(tools)} tools pooled from {SHARED}")
    results: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for with_graph in (False, True):
            results[with_graph].append(one_round(tools, args.upserts, with_graph))
    for with_graph, label in ((False, "without graph"), (True, "with graph")):
        rows = results[with_graph]
        print(f"{label:14} upload {statistics.median(r[0] for r in rows):7.3f} s   one-tool upsert "
              f"{1000 * statistics.median(r[1] for r in rows):7.1f} ms   edges {rows[-1][2]}")
    up = [statistics.median(r[i] for r in results[g]) for g in (False, True) for i in (0, 1)]
    print(f"graph share: upload {100 * (up[2] / up[0] - 1):+.1f}%, one-tool upsert {100 * (up[3] / up[1] - 1):+.1f}%")
    t0 = time.perf_counter()
    parsed = parse_tools(tools, ToolLimits(max_tools=10**6))
    t1 = time.perf_counter()
    ToolGraph.build(parsed)
    print(f"ToolGraph.build alone on {len(parsed)} tools: {time.perf_counter() - t1:.3f} s (parse {t1 - t0:.3f} s)")


if __name__ == "__main__":
    main()
