"""Offline sweep of the usage memory's knobs (similarity, beta, candidates) on the dev sets.

Fast stand-in for ``bench/usage_memory.py``: the hybrid top-20 of every query is computed once
(real MiniLM), the memory (``registry.learning.usage.UsageMemory``) is fed 5,000 agent-model
events from the first half (shown = the top 3; used: gold when shown, else gold with
probability 0.5, 10% noise; ten honest callers), and found@1 is read by re-ranking the top-20
of 600 held-out queries and 300 stream queries ("seen"). No depth policy: found@1 only.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/usage_sweep.py --datasets bfcl_simple metatool \
        --similarity 0.5,0.6,0.7,0.8 --beta 0.15,0.3,0.6 --candidates 10
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import DEFAULT_EMBEDDER_CACHE, agent_uses
from registry.index.hybrid import Query, rank
from registry.index.lexical import tokenize
from registry.index.minilm_export import load_minilm
from registry.learning.usage import UsageConfig, UsageMemory
from registry.offline.datasets import index_dataset, load_dataset

DATA = Path("/work/shared/data")


@dataclass(frozen=True)
class Event:
    shortlist_id: str
    used: tuple[str, ...]
    query: str
    caller: str
    registry: str = "r"
    success: bool = True
    calls: tuple = ()
    received: float = 1.0


def prepare(name: str, embedder, n_train: int = 3000, n_held: int = 600) -> tuple:
    ds = load_dataset(DATA / name)
    snap = index_dataset(ds.tools, embedder)
    queries = list(ds.queries)
    order = list(range(len(queries)))
    random.Random(11).shuffle(order)
    half = len(order) // 2
    train = [queries[i] for i in order[:half]][:n_train]
    held = [queries[i] for i in order[half:]][:n_held]

    def ranked(q):
        v = embedder.embed_query(q.query)
        ids, scores = rank("hybrid", Query(v, tokenize(q.query)), snap.dense, snap.lexical, 20)
        return v, [snap.tools[int(i)].name for i in ids], scores

    return train, [ranked(q) for q in train], held, [ranked(q) for q in held], [t.name for t in snap.tools]


def run(prepared: tuple, config: UsageConfig, events: int = 5000, attack: float = 0.0) -> dict[str, float]:
    train, train_rows, held, held_rows, names = prepared
    memory = UsageMemory(lambda text: np.zeros(1), config)
    rng = random.Random(5)
    sent = 0
    while sent < events:
        j = rng.randrange(len(train))
        q, (v, candidates, _) = train[j], train_rows[j]
        shown, gold = candidates[:3], list(q.gold)
        caller = f"h{sent % 10}"
        if rng.random() < attack:
            used, caller = [n for n in shown if n not in gold][:1] or [rng.choice(names)], "attacker"
        else:
            reported = agent_uses(rng, gold, shown)
            if reported is None:
                continue
            used = reported
        memory.observe(Event(f"s{sent}", tuple(used), q.query, caller), vector=v)
        sent += 1

    def found_at_1(rows, qs) -> tuple[float, float]:
        base = lifted = 0
        for (v, candidates, scores), q in zip(rows, qs, strict=True):
            base += candidates[0] in q.gold
            lifted += candidates[int(np.argmax(memory.boost("r", v, candidates, scores)))] in q.gold
        return 100 * base / len(qs), 100 * lifted / len(qs)

    (hb, hl), (sb, sl) = found_at_1(held_rows, held), found_at_1(train_rows[:300], train[:300])
    return {"held_base": hb, "held": hl, "seen_base": sb, "seen": sl}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["bfcl_simple", "metatool", "toolbench_stable"])
    parser.add_argument("--similarity", default="0.5,0.6,0.7,0.8")
    parser.add_argument("--beta", default="0.3")
    parser.add_argument("--candidates", default="10")
    parser.add_argument("--poison", action="store_true", help="also a run with a 30%% poisoner")
    args = parser.parse_args()
    embedder = load_minilm(DEFAULT_EMBEDDER_CACHE)
    for name in args.datasets:
        prepared = prepare(name, embedder)
        for sim in map(float, args.similarity.split(",")):
            for beta in map(float, args.beta.split(",")):
                for cand in map(int, args.candidates.split(",")):
                    config = UsageConfig(similarity=sim, beta=beta, candidates=cand)
                    row = {"dataset": name, "similarity": sim, "beta": beta, "candidates": cand,
                           **run(prepared, config)}
                    if args.poison:
                        row["poisoned_held"] = run(prepared, config, attack=0.3)["held"]
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
