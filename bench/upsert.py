"""One-tool writes to a large registry: deriving the HNSW graph from the previous version
against rebuilding it, measured in the same run.

    python bench/upsert.py --tools 100000

Builds a registry of ``--tools`` synthetic tools in an engine on a local store, then times a
one-tool upsert and a one-tool delete end to end (``ShortlistEngine``: parse, vectors, BM25,
FAISS, store write), and the snapshot build alone with and without the previous version
(``build_snapshot(previous=...)``), best of ``--repeat``. Vectors come from the hashing
embedder so the run takes minutes, not the hour MiniLM would need for 100,000 texts; what is
measured (graph construction vs clone-and-add, BM25, the store) does not depend on which
embedder made the vectors. Also checks the derived snapshot answers like a rebuilt one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "bench"))
from perf import synthetic_tools  # noqa: E402

from registry.depth.policies import OnnxDepthPolicy  # noqa: E402
from registry.engine import ShortlistEngine  # noqa: E402
from registry.index.embed import HashingEmbedder  # noqa: E402
from registry.settings import Settings  # noqa: E402
from registry.snapshot import build_snapshot  # noqa: E402
from registry.store.local import LocalStore  # noqa: E402


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tools", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tools = synthetic_tools(args.tools)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), demo_registry=None, max_tools_per_registry=args.tools + 10)
        embedder = HashingEmbedder()
        engine = ShortlistEngine(settings, LocalStore(settings.data_dir), embedder,
                                 OnnxDepthPolicy.from_dir(ROOT / "models" / "default"))
        t0 = time.perf_counter()
        engine.put_registry("big", tools)
        initial = time.perf_counter() - t0
        snap = engine.snapshot("big")
        print(f"registry of {args.tools:,} tools ({snap.dense.kind}) indexed in {initial:.1f} s", file=sys.stderr)

        counter = iter(range(10**6))
        upsert = best(lambda: engine.upsert_tools(
            "big", [{"name": f"new_tool_{next(counter)}", "description": "counts zebras on the savanna"}]),
            args.repeat)
        names = [t["name"] for t in tools]
        delete = best(lambda: engine.delete_tool("big", names.pop()), args.repeat)

        current = engine.snapshot("big")
        changed = [*current.tools[:-1]]
        extra = {"name": "bench_extra", "description": "a tool added to time the snapshot build"}
        from registry.tools import ToolLimits, parse_tools

        changed += parse_tools([extra], ToolLimits())

        def build(previous):
            return build_snapshot("big", current.version + 1, changed, embedder, engine.store,
                                  hnsw_min_tools=settings.hnsw_min_tools, previous=previous)

        derived_s = best(lambda: build(current), args.repeat)
        rebuilt_s = best(lambda: build(None), 1)
        derived, rebuilt = build(current), build(None)
        recall = {"derived": [], "rebuilt": []}
        rng = np.random.default_rng(1)
        for q in rng.choice(len(changed), 200, replace=False):
            words = changed[int(q)].text().split()
            v = embedder.embed_query(" ".join(rng.choice(words, 6)))  # a partial, noisy query
            exact = set(np.argsort(-(derived.dense.embeddings @ v))[:10])
            for name, snap_ in (("derived", derived), ("rebuilt", rebuilt)):
                recall[name].append(len(set(snap_.dense.search(v, 10)[0]) & exact) / 10)
    print(f"| one-tool write, N = {args.tools:,} | seconds |\n|---|---|")
    print(f"| upsert (engine, end to end) | {upsert:.3f} |")
    print(f"| delete (engine, end to end) | {delete:.3f} |")
    print(f"| snapshot build, graph derived from the previous version | {derived_s:.3f} |")
    print(f"| snapshot build, graph rebuilt (before this change) | {rebuilt_s:.3f} |")
    print(f"\nrecall@10 against exact search, 200 queries: derived {np.mean(recall['derived']):.3f}, "
          f"rebuilt {np.mean(recall['rebuilt']):.3f}; dead slots after the writes: {derived.dense.dead_slots}")


if __name__ == "__main__":
    main()
