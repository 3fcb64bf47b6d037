"""Offline choice of the usage-profile maths (issue 22): which per-tool profile, fused how,
carries feedback over to *new phrasings* without costing requests for *unseen tools*.

Numpy only, on cached MiniLM embeddings (``--cache``) of each set's tools and queries; the base
ranking is the dense cosine (the service adds BM25, so absolute figures differ from the
service's). Per set: queries split 50/50 (seed 11); an agent stream of ``--events`` events drawn
from the first half with the learning benchmarks' agent model (``bench.common.agent_uses`` on
the base top ``SHOWN``); the held-out half is scored as *seen tool* (its gold tool got feedback)
or *unseen tool*. Each profile variant's weight is fitted per registry on the logged events
(the same 70/30 split and refusal rule the service uses, :mod:`registry.learning.profiles`),
so this measures the shipped procedure, not a weight tuned on the test queries.

    nice -n 10 python bench/profile_offline.py --sets metatool bfcl_simple ... --events 500,2000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import SHARED_DATA, agent_uses, raw_dataset
from registry.learning.profiles import (
    PassedOver,
    ProfileConfig,
    build_profiles,
    fit_weight,
    fused_scores,
)
from registry.tool_text import tool_text

SEED = 11
SHOWN = 5
CANDIDATES = 10


def embeddings(name: str, cache: Path, max_queries: int, root: Path = SHARED_DATA) -> tuple[list[str], np.ndarray, list[dict[str, Any]], np.ndarray]:
    tools, queries = raw_dataset(name, root)
    if isinstance(tools, dict):
        tools = tools.get("tools", tools)
    queries = queries[:max_queries]
    path = cache / f"{name.replace('/', '_')}-{len(queries)}.npz"
    names = [t["name"] for t in tools]
    if path.exists():
        data = np.load(path)
        return names, data["tools"], queries, data["queries"]
    from registry.index.minilm_export import load_minilm

    embedder = load_minilm(cache / "embedder")
    texts = [tool_text(t["name"], t.get("description", ""), t.get("parameters")) for t in tools]
    tv = embedder.embed_documents(texts)
    qv = embedder.embed_documents([q["query"] for q in queries])
    np.savez(path, tools=tv, queries=qv)
    return names, tv, queries, qv


def run_set(
    name: str, cache: Path, checkpoints: list[int], max_queries: int, cfg: ProfileConfig, root: Path,
    unseen_share: float = 0.0,
) -> dict[str, Any]:
    names, tv, queries, qv = embeddings(name, cache, max_queries, root)
    index = {n: i for i, n in enumerate(names)}
    rng = random.Random(SEED)
    order = list(range(len(queries)))
    rng.shuffle(order)
    half = len(order) // 2
    stream_ids, held_ids = order[:half], order[half:][:2000]
    if unseen_share > 0:  # tools whose requests never reach the stream: their held-out
        hidden = set(random.Random(SEED + 2).sample(names, int(unseen_share * len(names))))  # requests
        stream_ids = [i for i in stream_ids if not hidden & set(queries[i]["gold"])]  # are unseen
    base = qv @ tv.T
    top = np.argsort(-base, axis=1)[:, :SHOWN]
    out: dict[str, Any] = {"set": name, "tools": len(names), "held_out": len(held_ids), "rows": []}
    events: list[tuple[int, list[int], str]] = []
    erng = random.Random(SEED + 1)
    for target in checkpoints:
        while len(events) < target:
            qi = erng.choice(stream_ids)
            shown = [names[j] for j in top[qi]]
            used = agent_uses(erng, queries[qi]["gold"], shown)
            if used is None:
                continue
            events.append((qi, [index[u] for u in used if u in index], f"agent-{len(events) % 10}"))
        vecs = qv[[e[0] for e in events]] if events else np.empty((0, qv.shape[1]), np.float32)
        tools_of = [e[1] for e in events]
        callers = [e[2] for e in events]
        keys = [queries[e[0]]["query"] for e in events]  # split by request text (as the service)
        shown_of = [top[e[0]].tolist() for e in events]
        weight, fit_report = fit_weight(vecs, tools_of, callers, tv, cfg, keys=keys, shown=shown_of)
        passed_over = PassedOver()  # as the service's memory keeps it
        for v, ts, sh in zip(vecs, tools_of, shown_of, strict=True):
            for t in sh:
                if t not in ts:
                    passed_over.add(t, v)
        profiles = build_profiles(vecs, tools_of, callers, tv, cfg)
        seen_tools = {t for ts in tools_of for t in ts}
        row: dict[str, Any] = {"events": target, "weight": weight, "fit": fit_report}
        for kind in ("seen", "unseen"):
            ids = [i for i in held_ids
                   if any(index.get(g) in seen_tools for g in queries[i]["gold"]) == (kind == "seen")]
            at1_off = at1_on = found_off = found_on = 0
            for i in ids:
                gold = {index[g] for g in queries[i]["gold"] if g in index}
                order_ids = np.argsort(-base[i])[:20]
                scores = base[i, order_ids].astype(np.float32)
                lifted = fused_scores(profiles, qv[i], order_ids, scores, weight, cfg, passed_over)
                new = order_ids[np.argsort(-lifted, kind="stable")]
                at1_off += int(order_ids[0] in gold)
                at1_on += int(new[0] in gold)
                found_off += int(bool(gold & set(order_ids[:SHOWN].tolist())))
                found_on += int(bool(gold & set(new[:SHOWN].tolist())))
            n = max(len(ids), 1)
            row[kind] = {"n": len(ids), "found@1_off": round(100 * at1_off / n, 1),
                         "found@1_on": round(100 * at1_on / n, 1),
                         "found@5_off": round(100 * found_off / n, 1),
                         "found@5_on": round(100 * found_on / n, 1)}
        out["rows"].append(row)
        print(name, json.dumps(row), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=["metatool", "bfcl_simple", "toolbench_stable"])
    parser.add_argument("--events", default="500,2000,5000")
    parser.add_argument("--max-queries", type=int, default=8000)
    parser.add_argument("--cache", type=Path, default=Path("data/cache/profile_offline"))
    parser.add_argument("--knob", action="append", default=[], help="ProfileConfig field=value")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--unseen-share", type=float, default=0.0,
                        help="share of tools kept out of the stream (their requests are unseen-tool)")
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="the dev sets' folder")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    knobs = {k: float(v) for k, v in (kv.split("=") for kv in args.knob)}
    cfg = ProfileConfig(**knobs)  # type: ignore[arg-type]
    checkpoints = [int(x) for x in args.events.split(",")]
    results = {"config": str(cfg), "sets": [run_set(s, args.cache, checkpoints, args.max_queries, cfg, args.data,
                                                      args.unseen_share)
                                              for s in args.sets]}
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
