"""Does the shipped `bor` policy work on a registry it never saw? Measured over HTTP.

    python bench/studies/unseen_registry.py --data ../shared/data/toolbench_stable [--max-queries 765]

Starts the real server, uploads the data set's tools.json as a registry, and for every query
asks POST /shortlist twice: with the default policy, and with k=50 to learn where the gold tool
ranks (which gives the found rate of every fixed K from the same ranking). Prints the policy's
found rate, mean K and K distribution next to fixed K = 1, 3, 5, 10 and the fixed depth
interpolated to the policy's mean K.

``--record models/default`` also stores the figures in that policy's ``manifest.json`` under
``metrics.unseen_<data set>`` (the manifest is not part of the hashed ONNX file, so the policy
stays valid); pass the directory of the policy the server loaded.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import DEFAULT_EMBEDDER_CACHE, serve
from registry.fsio import atomic_write_bytes
from registry.offline.metrics import depth_efficiency, fixed_found_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--max-queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-k", type=int, default=None)
    parser.add_argument("--embedder-cache", type=Path, default=DEFAULT_EMBEDDER_CACHE)
    parser.add_argument("--record", type=Path, default=None, metavar="POLICY_DIR",
                        help="store the figures in POLICY_DIR/manifest.json (metrics.unseen_<data set>)")
    args = parser.parse_args()

    tools = json.loads((args.data / "tools.json").read_text())
    queries = [json.loads(line) for line in (args.data / "queries.jsonl").read_text().splitlines() if line.strip()]
    if len(queries) > args.max_queries:
        queries = random.Random(args.seed).sample(queries, args.max_queries)

    with serve(args.embedder_cache) as server, httpx.Client(base_url=server.url, timeout=300) as client:
        info = client.put("/registries/unseen", json=tools).raise_for_status().json()
        ks, found, first_rank, rejected = [], [], [], []
        for q in queries:
            body = {"registry": "unseen", "query": q["query"]}
            if args.max_k:
                body["max_k"] = args.max_k
            response = client.post("/shortlist", json=body)
            if response.status_code == 422:  # e.g. a query above SHORTLIST_MAX_QUERY_CHARS
                rejected.append(response.json()["error"]["message"])
                continue
            shown = response.raise_for_status().json()
            names = {t["name"] for t in shown["tools"]}
            ks.append(shown["k"])
            found.append(bool(names & set(q["gold"])))
            deep = client.post("/shortlist", json={**body, "k": 50}).raise_for_status().json()
            ranks = [t["rank"] for t in deep["tools"] if t["name"] in q["gold"]]
            first_rank.append(min(ranks) if ranks else 10**9)

    ks_arr, first = np.array(ks), np.array(first_rank)
    fixed = {k: float(np.mean(first <= k)) for k in range(1, 51)}
    curve = np.array([0.0, *fixed.values()])  # found at fixed K = 0..50 (HTTP ranks, 1-based)
    mean_k = float(ks_arr.mean())
    at_mean = fixed_found_at(curve, mean_k)
    dist = collections.Counter(ks)
    print(f"registry {args.data.name}: N={info['tools']}, {len(ks)} queries (never trained on); "
          f"{len(rejected)} rejected with 422: {collections.Counter(rejected).most_common(2)}")
    print(f"bor      found {100 * np.mean(found):.1f}%  mean K {mean_k:.2f}  K std {ks_arr.std():.2f}  "
          f"distinct K {len(dist)}: {dict(sorted(dist.items()))}")
    print(f"fixed K at the same mean K (interpolated): found {100 * at_mean:.1f}%")
    for k in (1, 3, 5, 10, 20):
        print(f"fixed K={k:<3} found {100 * fixed[k]:.1f}%")
    efficiency = depth_efficiency(curve, float(np.mean(found)), mean_k)
    print(f"depth efficiency {efficiency:.2f}")
    if args.record:
        path = args.record / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest.setdefault("metrics", {})[f"unseen_{args.data.name}"] = {
            "how": f"python bench/studies/unseen_registry.py --data {args.data} --max-queries {args.max_queries} "
                   f"(real server over HTTP, max_k {args.max_k or 'service default'})",
            "n_tools": info["tools"], "n_queries": len(ks), "found": round(float(np.mean(found)), 4),
            "mean_k": round(mean_k, 3), "k_std": round(float(ks_arr.std()), 3), "distinct_k": len(dist),
            "fixed_found_at_mean_k": round(at_mean, 4),
            "fixed": {str(k): round(fixed[k], 4) for k in (1, 3, 5, 10, 20)},
            "efficiency": round(efficiency, 3),
        }
        atomic_write_bytes(path, (json.dumps(manifest, indent=2) + "\n").encode())
        print(f"recorded in {path}")


if __name__ == "__main__":
    main()
