"""Usage memory (issue 11 items 1, 4): does feedback from a simulated agent lift found@1 on
held-out queries, does a poisoner move it, and what does it cost per query?

For each dev set the queries are split 50/50 by a fixed seed. A stream of agent episodes draws
queries from the first half against the in-process core (``registry.core.Shortlister``, real
MiniLM, the default bor policy, exploration off so K is the policy's own) and reports feedback
with the issue's agent model: it uses the gold tool(s) when shown; when not, with probability
0.5 it found them elsewhere and reports them, else it sends nothing; 10% of events are noise
(a random shown tool). Ten honest callers take turns. At 0 / 1k / 5k events the held-out half
(and a sample of the first half: "seen") is evaluated with the registry's learning switched on
and off (the same core, same moment: the off rows are the no-learning baseline).

Poisoning: the memory is wiped and the stream replayed with one extra caller sending 30% of the
events, each naming the best-ranked shown tool that is not gold (a plausible wrong tool).

Cost: a 500-tool registry (StableToolBench's first 500 tools) with 20,000 events of memory
(and a usage profile per tool, scored with ``--profile-weight``), p50 of ``core.shortlist`` on
repeated queries (query cache on: the embedding is not what is measured) with learning on and
off, in alternating rounds.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/studies/usage_memory.py [--datasets bfcl_simple ...]
        [--events 1000,5000] [--eval 600] [--out bench/out/usage_memory.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from registry.feedback import FeedbackRequest
from registry.request import ShortlistRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import DEFAULT_EMBEDDER_CACHE, raw_dataset, reported_uses
from registry.core import Shortlister
from registry.feedback import FeedbackEvent
from registry.settings import Settings

SEED = 11
HONEST = [f"agent-{i}" for i in range(10)]


def make_core(data_dir: Path, **overrides: Any) -> Shortlister:
    settings = Settings(
        data_dir=data_dir,
        embedder_cache_dir=DEFAULT_EMBEDDER_CACHE,
        demo_registry=None,
        query_cache_size=100_000,
        explore_share=0.0,
        learning_save_interval_seconds=3600.0,
        max_tools_per_registry=50_000,
        **overrides,
    )
    return Shortlister.from_settings(settings, start=True)


def evaluate(core: Shortlister, registry: str, queries: list[dict[str, Any]]) -> dict[str, float]:
    at1 = found = depth = 0
    for q in queries:
        names = [t.name for t in core.shortlist(ShortlistRequest(registry, q["query"])).tools]
        gold = set(q["gold"])
        at1 += bool(names) and names[0] in gold
        found += not gold.isdisjoint(names)
        depth += len(names)
    n = max(len(queries), 1)
    return {"found@1": 100 * at1 / n, "found": 100 * found / n, "mean_k": depth / n}


def both(core: Shortlister, registry: str, held: list[dict[str, Any]], seen: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for switch in (True, False):
        core.set_learning(registry, switch)
        key = "on" if switch else "off"
        row[key] = {"held_out": evaluate(core, registry, held), "seen": evaluate(core, registry, seen)}
    core.set_learning(registry, True)
    return row


def stream(
    core: Shortlister, registry: str, train: list[dict[str, Any]], events: int, rng: random.Random,
    attacker_share: float = 0.0,
) -> int:
    """Episodes until ``events`` feedback events were sent; returns how many were counted."""
    sent = counted = 0
    names = [t.name for t in core.snapshot(registry).tools]  # the poisoner's fallback picks
    while sent < events:
        q = rng.choice(train)
        attack = rng.random() < attacker_share
        caller = "attacker" if attack else HONEST[sent % len(HONEST)]
        result = core.shortlist(ShortlistRequest(registry, q["query"]), caller=caller)
        shown = [t.name for t in result.tools]
        gold = list(q["gold"])
        reported = reported_uses(rng, gold, shown, names, attack=attack)
        if reported is None:
            continue
        used = reported
        report = FeedbackRequest(result.shortlist_id, used, success=True)
        event: FeedbackEvent = core.feedback(report, caller=caller).event
        sent += 1
        counted += event is not None
    return counted


def run_dataset(
    name: str, checkpoints: list[int], n_eval: int, base: Path, knobs: dict[str, Any]
) -> dict[str, Any]:
    tools, queries = raw_dataset(name)
    rng = random.Random(SEED)
    order = list(range(len(queries)))
    rng.shuffle(order)
    half = len(order) // 2
    train = [queries[i] for i in order[:half]]
    held = [queries[i] for i in order[half:]][:n_eval]
    seen = train[: n_eval // 2]
    core = make_core(base / name, **knobs)
    try:
        t0 = time.time()
        core.put_registry("r", tools)
        core.wipe_learning("r")  # a reused --base directory keeps the last run's memory
        print(f"[{name}] {len(tools) if isinstance(tools, list) else '?'} tools loaded in {time.time() - t0:.0f}s", flush=True)
        curve = []
        done = 0
        agent = random.Random(SEED + 1)
        for target in [0, *checkpoints]:
            stream(core, "r", train, target - done, agent)
            done = target
            row = {"events": target, **both(core, "r", held, seen)}
            row["learning"] = {k: v for k, v in core.learning_report("r").items() if k != "caller_shares"}
            curve.append(row)
            print(f"[{name}] {json.dumps(row)}", flush=True)
        core.wipe_learning("r")
        poison_rng = random.Random(SEED + 2)
        stream(core, "r", train, checkpoints[-1], poison_rng, attacker_share=0.3)
        poison = {"events": checkpoints[-1], **both(core, "r", held, seen)}
        report = core.learning_report("r")
        poison["attacker_share"] = next(
            (s["share"] for s in report["caller_shares"] if s["caller"] == "attacker"), 0.0
        )
        poison["skipped"] = report["skipped"]
        print(f"[{name}] poison {json.dumps(poison)}", flush=True)
    finally:
        core.close()
    return {"dataset": name, "train": len(train), "held_out": len(held), "seen": len(seen),
            "curve": curve, "poison": poison}


def cost(
    base: Path, knobs: dict[str, Any], rounds: int = 4, per_round: int = 300, profile_weight: float = 0.5
) -> dict[str, Any]:
    """p50 of core.shortlist at 500 tools with 20k events of memory (usage profiles scored
    with ``profile_weight``, as after a refit that shipped one), learning on vs off."""
    tools, queries = raw_dataset("toolbench_stable")
    tools = tools[:500] if isinstance(tools, list) else tools
    core = make_core(base / "cost", **knobs)
    try:
        core.put_registry("r", tools)
        core.wipe_learning("r")
        snap = core.snapshot("r")
        memory = core.learning.memory
        rng = np.random.default_rng(SEED)
        emb = snap.dense.embeddings
        for i in range(20_000):
            t = i % snap.n_tools
            v = emb[t] + np.asarray(rng.normal(0, 0.08, emb.shape[1]), dtype=np.float32)
            ev = FeedbackEvent(
                shortlist_id=f"c{i}", registry="r", version=snap.version, n_tools=snap.n_tools, k=5,
                shown=(), used=(snap.tools[t].name,), success=True, calls=(), presented_exact=True,
                presented_equivalent=True, p_rand_exact=0.0, p_rand_equivalent=0.0,
                received=time.time(), query=f"synthetic {i}", caller=None,
            )
            memory.observe(ev, vector=v)
        memory.set_weight("r", profile_weight)
        texts = [q["query"] for q in queries[:per_round]]
        for text in texts:  # warm the query cache
            core.shortlist(ShortlistRequest("r", text))
        timings: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(rounds):
            for switch in (False, True):
                core.set_learning("r", switch)
                for text in texts:
                    t0 = time.perf_counter()
                    core.shortlist(ShortlistRequest("r", text))
                    timings["on" if switch else "off"].append(time.perf_counter() - t0)
        p50 = {k: 1000 * statistics.median(v) for k, v in timings.items()}
        return {"tools": snap.n_tools, "memory_entries": memory.entries("r"), "p50_ms": p50,
                "profile_weight": profile_weight, "tools_with_profile": len(memory.report("r")["profiles"]),
                "delta_ms": p50["on"] - p50["off"], "samples": len(timings["on"])}
    finally:
        core.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="*", default=["bfcl_simple", "metatool", "toolbench_stable"])
    parser.add_argument("--events", default="1000,5000")
    parser.add_argument("--eval", type=int, default=600, help="held-out queries evaluated per checkpoint")
    parser.add_argument("--no-cost", action="store_true")
    parser.add_argument("--profile-weight", type=float, default=0.5,
                        help="the usage profiles' weight in the cost run (0: memory recall only)")
    parser.add_argument("--out", type=Path, default=Path("bench/out/usage_memory.json"))
    parser.add_argument("--base", type=Path, help="data directory to reuse (tool embeddings cached)")
    parser.add_argument("--knob", action="append", default=[], help="a learning_* setting, e.g. beta=0.2")
    args = parser.parse_args()
    knobs = {f"learning_{k}": float(v) if "." in v else int(v) for k, v in (x.split("=") for x in args.knob)}
    checkpoints = [int(x) for x in args.events.split(",")]
    results: dict[str, Any] = {"seed": SEED, "knobs": knobs, "datasets": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = args.base or Path(tmp)
        if not args.no_cost:
            results["cost"] = cost(base, knobs, profile_weight=args.profile_weight)
            print(f"cost {json.dumps(results['cost'])}", flush=True)
        for name in args.datasets:
            results["datasets"].append(run_dataset(name, checkpoints, args.eval, base, knobs))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
