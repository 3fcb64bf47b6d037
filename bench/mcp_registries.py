"""How the service shortlists on small real MCP registries, with hand-labelled tasks.

    python bench/mcp_registries.py [--json bench/out/mcp_registries.json] [--per-registry]

Loads every harvested registry that has tasks (``bench/data/mcp_registries/<stem>.json``, plus
the ``gateway`` union) into an in-process :class:`registry.assembly.Registries` with the real
MiniLM embedder, the shipped ``bor`` policy and a throwaway local store, then asks
``engine.shortlist(ShortlistRequest(registry, query))`` for every task of ``bench/data/mcp_tasks.jsonl``: with the
default policy, with fixed k = 1, 3, 5, and with k = N (the whole ranking, for the fixed-K curve).

Per size bucket (N <= 10, 11-25, 26-60, gateway) and overall it prints: tasks, any-found (at
least one gold tool shown), all-found (every gold tool shown), mean K, the share of answers
that are the whole registry, any/all-found at fixed K = 1, 3, 5, and any/all-found of a fixed
depth interpolated at the policy's mean K of that bucket (read off the k = N ranking).

Only ``Shortlist.tools[i].name`` is read from the engine's answers, so new optional fields on
the response do not matter.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from registry.request import ShortlistRequest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from registry.assembly import Registries  # noqa: E402
from registry.index.embedders import load_minilm  # noqa: E402
from registry.serving.depth_policies import OnnxDepthPolicy  # noqa: E402
from registry.settings import Settings  # noqa: E402
from registry.store.local import LocalStore  # noqa: E402

DATA = ROOT / "bench" / "data"
DEFAULT_EMBEDDER_CACHE = ROOT / "data" / "cache" / "embedder"
FIXED_KS = (1, 3, 5)
BUCKETS: tuple[tuple[str, Callable[[str, int], bool]], ...] = (
    ("N<=10", lambda reg, n: reg != "gateway" and n <= 10),
    ("N 11-25", lambda reg, n: reg != "gateway" and 11 <= n <= 25),
    ("N 26-60", lambda reg, n: reg != "gateway" and 26 <= n <= 60),
    ("gateway", lambda reg, n: reg == "gateway"),
)


@dataclass(frozen=True)
class Outcome:
    """One task's answers: what the policy showed, and where each gold tool ranks."""

    task: dict[str, Any]
    n: int
    shown: list[str]  # default policy
    fixed: dict[int, list[str]]  # explicit k requests
    gold_ranks: list[int]  # 1-based ranks of the gold tools in the k = N answer

    def hits(self, names: Iterable[str]) -> tuple[bool, bool]:
        gold, seen = set(self.task["gold"]), set(names)
        return bool(gold & seen), gold <= seen

    def found_at(self, k: float) -> tuple[bool, bool]:
        """Any/all found by a fixed depth ``k`` on the k = N ranking."""
        return min(self.gold_ranks) <= k, max(self.gold_ranks) <= k


def run(
    engine: Registries, tasks: list[dict[str, Any]], sizes: dict[str, int]
) -> list[Outcome]:
    outcomes = []
    for task in tasks:
        reg, query, n = task["registry"], task["query"], sizes[task["registry"]]
        shown = [t.name for t in engine.shortlist(ShortlistRequest(reg, query)).tools]
        fixed = {k: [t.name for t in engine.shortlist(ShortlistRequest(reg, query, k=k)).tools] for k in FIXED_KS}
        ranking = [t.name for t in engine.shortlist(ShortlistRequest(reg, query, k=n)).tools]
        ranks = [ranking.index(g) + 1 if g in ranking else n + 1 for g in task["gold"]]
        outcomes.append(Outcome(task, n, shown, fixed, ranks))
    return outcomes


def summarise(outcomes: list[Outcome]) -> dict[str, Any]:
    """The figures of one group of tasks (shares in [0, 1])."""
    if not outcomes:
        return {"tasks": 0}
    policy = np.array([o.hits(o.shown) for o in outcomes], dtype=float)
    ks = np.array([len(set(o.shown)) for o in outcomes], dtype=float)
    mean_k = float(ks.mean())
    whole = float(np.mean([len(set(o.shown)) >= o.n for o in outcomes]))
    fixed = {}
    for k in FIXED_KS:
        got = np.array([o.hits(o.fixed[k]) for o in outcomes], dtype=float)
        fixed[str(k)] = {"any": float(got[:, 0].mean()), "all": float(got[:, 1].mean())}
    # The fixed-depth curve from the k = N rankings, interpolated at the policy's mean K.
    grid = np.arange(0, max(o.n for o in outcomes) + 1)
    curve = np.array([[o.found_at(k) for o in outcomes] for k in grid], dtype=float).mean(axis=1)
    at_mean = {"any": float(np.interp(mean_k, grid, curve[:, 0])),
               "all": float(np.interp(mean_k, grid, curve[:, 1]))}
    return {
        "tasks": len(outcomes),
        "multi": sum(o.task["kind"] == "multi" for o in outcomes),
        "any": float(policy[:, 0].mean()),
        "all": float(policy[:, 1].mean()),
        "mean_k": mean_k,
        "mean_n": float(np.mean([o.n for o in outcomes])),
        "whole_registry": whole,
        "fixed": fixed,
        "fixed_at_mean_k": at_mean,
    }


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}"


def print_table(title: str, rows: list[tuple[str, dict[str, Any]]]) -> None:
    fixed_head = " ".join(f"{f'K={k} any/all':>13}" for k in FIXED_KS)
    head = (f"{'group':<20} {'tasks':>5} {'multi':>5} {'mean N':>6} | {'any%':>5} {'all%':>5} "
            f"{'mean K':>6} {'whole%':>6} | {fixed_head} | {'fixed@meanK any/all':>19}")
    print(f"\n{title}\n{head}\n{'-' * len(head)}")
    for name, s in rows:
        if not s["tasks"]:
            continue
        fixed = " ".join(f"{_pct(s['fixed'][str(k)]['any'])}/{_pct(s['fixed'][str(k)]['all'])}"
                         for k in FIXED_KS)
        at = s["fixed_at_mean_k"]
        print(f"{name:<20} {s['tasks']:>5} {s['multi']:>5} {s['mean_n']:>6.1f} | {_pct(s['any'])} "
              f"{_pct(s['all'])} {s['mean_k']:>6.2f} {_pct(s['whole_registry']):>6} | {fixed} | "
              f"{_pct(at['any']):>9}/{_pct(at['all'])}")


def build_engine(tmp: Path, embedder_cache: Path) -> Registries:
    settings = Settings(data_dir=tmp, demo_registry=None)
    policy = OnnxDepthPolicy.from_dir(settings.policy_dir)
    return Registries.build(settings, LocalStore(tmp), load_minilm(embedder_cache), policy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registries", type=Path, default=DATA / "mcp_registries")
    parser.add_argument("--tasks", type=Path, default=DATA / "mcp_tasks.jsonl")
    parser.add_argument("--embedder-cache", type=Path, default=DEFAULT_EMBEDDER_CACHE)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--per-registry", action="store_true", help="also a row per registry")
    args = parser.parse_args()

    tasks = [json.loads(line) for line in args.tasks.read_text().splitlines() if line.strip()]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        engine = build_engine(Path(tmp), args.embedder_cache)
        sizes = {}
        for reg in sorted({t["registry"] for t in tasks}):
            record = json.loads((args.registries / f"{reg}.json").read_text())
            sizes[reg] = engine.writer.put_registry(reg, record).tools
        outcomes = run(engine, tasks, sizes)
        policy_name = engine.settings.default_policy

    buckets = [(name, summarise([o for o in outcomes if test(o.task["registry"], o.n)]))
               for name, test in BUCKETS]
    overall = summarise(outcomes)
    kinds = [(kind, summarise([o for o in outcomes if o.task["kind"] == kind]))
             for kind in ("single", "multi")]
    per_registry = [(reg, summarise([o for o in outcomes if o.task["registry"] == reg]))
                    for reg in sorted(sizes, key=lambda r: (r == "gateway", sizes[r], r))]
    print(f"{len(tasks)} tasks on {len(sizes)} MCP registries (policy {policy_name!r}, "
          f"MiniLM, in-process engine), {time.perf_counter() - started:.0f} s")
    print_table("by registry size", [*buckets, ("overall", overall)])
    print_table("by task kind", kinds)
    if args.per_registry:
        print_table("by registry", [(f"{r} (N={sizes[r]})", s) for r, s in per_registry])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": "python bench/mcp_registries.py", "policy": policy_name,
            "registries": sizes, "buckets": dict(buckets), "overall": overall,
            "kinds": dict(kinds), "per_registry": dict(per_registry),
            "misses": [{"id": o.task["id"], "gold": o.task["gold"], "shown": o.shown}
                       for o in outcomes if not o.hits(o.shown)[1]],
        }, indent=1) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
