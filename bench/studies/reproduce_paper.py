"""Reproduce Table 2 of "How Many Tools Should an LLM Agent See?" on ../shared/data.

    python bench/studies/reproduce_paper.py --shared ../shared/data --out docs/generated --img docs/img

For each condition: rank the queries (full registry or the paper's candidate sets), split
train/test by seed, train a BoR DQN and an F1 DQN (reward 2/(K+1)) per seed with the paper's
hyper-parameters, and evaluate them next to fixed K, the score-gap cut-off and a threshold
cut-off on the test queries. Writes ``paper.json`` (every seed), ``paper.md`` (Table 2 rows:
ours next to the paper's, mean and std over seeds, depth efficiency) and PNG figures (Figure 1
for ToolBench N=50 and MetaTool N=50, the found-vs-K curves). About 5 minutes on one core.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from registry.fsio import json_safe
from registry.index.embedders import load_minilm
from registry.offline.evaluate import (
    RankedSet,
    candidate_episodes,
    evaluate_ranked,
    load_or_build_table,
    plot_report,
    rank_table,
)
from registry.offline.metrics import found_rate
from registry.offline.train import train_dqn
from registry.serving.depth_policies import GapPolicy, ThresholdPolicy

ROOT = Path(__file__).resolve().parents[2]

# The paper's Table 2 (found %, K; F1 found %, K; best fixed K found % and K).
PAPER = {
    "BFCL+BM25 (N=370)": dict(bor=(90.3, 7.4), f1=(88.9, 6.4), best_fk=(90.8, 50)),
    "BFCL+embed (N=370)": dict(bor=(85.0, 1.4), f1=(85.8, 1.6), best_fk=(97.5, 5)),
    "MetaTool+BM25 (N=100)": dict(bor=(96.2, 80.7), f1=(82.8, 57.2), best_fk=(83.7, 50)),
    "MetaTool+embed (N=100)": dict(bor=(73.3, 2.3), f1=(69.0, 3.0), best_fk=(74.7, 3)),
    "MetaTool (N=20)": dict(bor=(70.6, 1.6), f1=(63.3, 1.3), best_fk=(59.2, 1)),
    "MetaTool (N=50)": dict(bor=(74.7, 2.6), f1=(63.9, 1.2), best_fk=(59.2, 1)),
    "MetaTool (N=100)": dict(bor=(72.8, 2.1), f1=(63.3, 1.5), best_fk=(59.2, 1)),
    "ToolBench (N=50)": dict(bor=(61.9, 4.4), f1=(47.6, 1.5), best_fk=(77.3, 20)),
}


@dataclass
class Condition:
    name: str
    dataset: str
    scorer: str
    max_queries: int | None
    test_fraction: float
    n: int | None = None  # candidate-set size (None: full registry)
    n_hard: int | None = None  # None: no random fill
    step_cost: float = 0.01
    gamma: float = 0.95
    cap: int = 50
    buckets: tuple = ()
    figure1: bool = False
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "_" for c in self.name).strip("_").lower()


CONDITIONS = [
    Condition("BFCL+BM25 (N=370)", "bfcl_simple", "bm25", None, 0.3, step_cost=0.005,
              note="280/120 split; step cost 0.005 as the paper"),
    Condition("BFCL+embed (N=370)", "bfcl_simple", "dense", None, 0.3),
    Condition("MetaTool+BM25 (N=100)", "metatool", "bm25", 2000, 0.3, n=100, n_hard=24, gamma=1.0, cap=100,
              note="gold + 24 hard (MiniLM) + 75 random; gamma 1.0 as the paper"),
    Condition("MetaTool+embed (N=100)", "metatool", "dense", 2000, 0.3, n=100, n_hard=24, cap=100,
              note="gold + 24 hard + 75 random"),
    Condition("MetaTool (N=20)", "metatool", "dense", 1200, 0.3, n=20, cap=20),
    Condition("MetaTool (N=50)", "metatool", "dense", 1200, 0.3, n=50, cap=50, figure1=True,
              buckets=(("easy", 1, 1), ("medium", 2, 3), ("hard", 4, 10), ("very hard", 11, None))),
    Condition("MetaTool (N=100)", "metatool", "dense", 1200, 0.3, n=100, cap=100),
    Condition("ToolBench (N=50)", "toolbench_stable", "dense", None, 0.3, n=50, cap=50, figure1=True,
              note="StableToolBench, API level (2,479 APIs, 1-6 gold each); gold + hard distractors"),
]


def split_rows(n_rows: int, test_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    order = np.random.default_rng(seed).permutation(n_rows)
    n_test = round(test_fraction * n_rows)
    return sorted(order[n_test:].tolist()), sorted(order[:n_test].tolist())


def ranked_rows(cond: Condition, table, rows: list[int]) -> RankedSet:
    if cond.n is None:
        return rank_table(table, cond.scorer, rows=rows, depth=max(60, cond.cap + 3))
    # seed 0 for the random fill: the candidate sets are part of the data, the seeds vary the split
    return candidate_episodes(table, cond.scorer, cond.n, n_hard=cond.n_hard, seed=0, rows=rows,
                              depth=max(60, cond.cap + 3))


BIAS_GRID = (*np.round(np.arange(-1.0, 1.0001, 0.05), 2).tolist(), 1.5, 2.0, 3.0, 5.0, 10.0)


def budget_bias(trained, episodes: list, cap: int, budget_k: float) -> float:
    """The operating knob (``depth_bias``) for a depth budget, picked on TRAINING episodes:
    the bias finding most often with a training mean K <= ``budget_k`` (ties: the shorter)."""
    from registry.serving.depth_policies import first_stop
    from registry.serving.features import depth_features

    qs = [trained.q_values(depth_features(e.scores, e.n_tools, min(cap, e.scores.size, e.n_tools)))
          for e in episodes]
    best = None
    for bias in BIAS_GRID:
        ks = np.array([first_stop(q, bias) for q in qs])
        found, mean_k = found_rate(episodes, ks), float(ks.mean())
        if mean_k <= budget_k and (best is None or (found, -mean_k) > best[:2]):
            best = (found, -mean_k, bias)
    return best[2] if best else BIAS_GRID[0]


def run_condition(cond: Condition, table, seeds: list[int], steps: int, img: Path | None) -> dict:
    per_seed = []
    for seed in seeds:
        train_rows, test_rows = split_rows(table.n_queries, cond.test_fraction, seed)
        train = [e for e in ranked_rows(cond, table, train_rows).exact if e.n_gold > 0]
        test = ranked_rows(cond, table, test_rows)
        hp = dict(step_cost=cond.step_cost, gamma=cond.gamma, max_depth=cond.cap, seed=seed, steps=steps)
        bor = train_dqn(train, reward="bor", **hp)
        f1 = train_dqn(train, reward="f1", **hp)
        policies = {
            "BoR DQN": bor.choose_depth,
            "F1 DQN": f1.choose_depth,
            "gap": GapPolicy().choose_depth,
        }
        bias = None
        if cond.name in PAPER:  # the same policy at the paper's mean depth, knob set on train only
            bias = budget_bias(bor, train, cond.cap, PAPER[cond.name]["bor"][1])
            policies["BoR DQN @ paper budget"] = functools.partial(bor.choose_depth, bias=bias)
        # a fixed score cut-off only means something on a fixed scale: cosine 0.5, BM25 10
        threshold = 10.0 if cond.scorer == "bm25" else 0.5
        policies[f"threshold {threshold:g}"] = ThresholdPolicy(threshold).choose_depth
        kwargs = {"buckets": cond.buckets} if cond.buckets else {}
        rep = evaluate_ranked(test, policies, cap=cond.cap, **kwargs)
        rep["seed"] = seed
        rep["n_train"] = len(train)
        rep["budget_bias"] = bias
        per_seed.append(rep)
        if img is not None and seed == seeds[0]:
            plot_report(rep, img, figure1_policies=["BoR DQN", "F1 DQN", "fixed K=1", "fixed K=5", "gap"]
                        if cond.figure1 else None, slug=cond.slug)
        print(f"  seed {seed}: BoR {100 * _get(rep, 'BoR DQN')['found']:.1f}% @ K "
              f"{_get(rep, 'BoR DQN')['mean_k']:.2f}, F1 {100 * _get(rep, 'F1 DQN')['found']:.1f}% @ K "
              f"{_get(rep, 'F1 DQN')['mean_k']:.2f}", file=sys.stderr, flush=True)
    return {"condition": cond.name, "note": cond.note, "cap": cond.cap, "step_cost": cond.step_cost,
            "gamma": cond.gamma, "seeds": per_seed}


def _get(rep: dict, name: str) -> dict:
    return next(p for p in rep["policies"] if p["policy"] == name)


def _ms(values: list[float], scale: float = 1.0, nd: int = 1) -> str:
    arr = np.asarray(values, dtype=float) * scale
    if arr.size > 1:
        return f"{arr.mean():.{nd}f} ± {arr.std():.{nd}f}"
    return f"{arr.mean():.{nd}f}"


def summarise(result: dict) -> dict:
    reps = result["seeds"]

    def col(policy: str, key: str) -> list[float]:
        return [_get(r, policy)[key] for r in reps]

    def fixed(k: int) -> float | None:
        name = f"fixed K={k}"
        if not any(p["policy"] == name for p in reps[0]["policies"]):
            return None
        return float(np.mean(col(name, "found")))

    return {
        "bor_found": col("BoR DQN", "found"), "bor_k": col("BoR DQN", "mean_k"),
        "bor_kstd": col("BoR DQN", "k_std"), "bor_bits": col("BoR DQN", "bor_bits"),
        "bor_eff": col("BoR DQN", "efficiency"), "bor_at": col("BoR DQN", "fixed_found_at_mean_k"),
        "f1_found": col("F1 DQN", "found"), "f1_k": col("F1 DQN", "mean_k"),
        "f1_bits": col("F1 DQN", "bor_bits"), "f1_eff": col("F1 DQN", "efficiency"),
        "gap_found": col("gap", "found"), "gap_k": col("gap", "mean_k"), "gap_eff": col("gap", "efficiency"),
        "fk": {k: fixed(k) for k in (1, 3, 5, 10, 20, 50)},
        "n_test": reps[0]["n"], "n_train": reps[0]["n_train"],
    }


def verdict(s: dict, paper: dict | None) -> str:
    """Paper row matched or beaten = our found % at equal or lower mean K."""
    if paper is None:
        return "–"
    found, k = 100 * float(np.mean(s["bor_found"])), float(np.mean(s["bor_k"]))
    std = 100 * float(np.std(s["bor_found"]))
    p_found, p_k = paper["bor"]
    if k <= p_k + 1e-9 and found >= p_found:
        return "beaten"
    if k <= p_k + 1e-9 and found >= p_found - std:
        return "matched (within 1 std)"
    if k > p_k:
        return f"not comparable: deeper (K {k:.2f} > {p_k})" + (", more found" if found > p_found else "")
    return f"worse: {found - p_found:+.1f} pts at lower K"


def paper_table(results: list[dict]) -> str:
    lines = [
        "| condition | n train/test | BoR found % ours / paper | BoR mean K ours / paper | BoR K std | "
        "BoR bits | **BoR efficiency** | fixed K at BoR's mean K | F1 found % / K ours | F1 eff. | "
        "F1 found % / K paper | FK=1 / 3 / 5 found % | paper best FK | gap cut-off found % @ K (eff.) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        s = summarise(res)
        p = PAPER.get(res["condition"])
        paper_bor = f"{p['bor'][0]:.1f}" if p else "–"
        paper_k = f"{p['bor'][1]:.1f}" if p else "–"
        paper_f1 = f"{p['f1'][0]:.1f} / {p['f1'][1]:.1f}" if p else "–"
        paper_fk = f"{p['best_fk'][0]:.1f} (FK={p['best_fk'][1]})" if p else "–"
        fk = " / ".join(f"{100 * s['fk'][k]:.1f}" for k in (1, 3, 5) if s["fk"][k] is not None)
        lines.append(
            f"| {res['condition']} | {s['n_train']}/{s['n_test']} | {_ms(s['bor_found'], 100)} / {paper_bor} | "
            f"{_ms(s['bor_k'], nd=2)} / {paper_k} | {_ms(s['bor_kstd'], nd=1)} | {_ms(s['bor_bits'], nd=2)} | "
            f"**{_ms(s['bor_eff'], nd=2)}** | {_ms(s['bor_at'], 100)} | "
            f"{_ms(s['f1_found'], 100)} / {_ms(s['f1_k'], nd=2)} | {_ms(s['f1_eff'], nd=2)} | {paper_f1} | "
            f"{fk} | {paper_fk} | "
            f"{_ms(s['gap_found'], 100)} @ {_ms(s['gap_k'], nd=2)} ({_ms(s['gap_eff'], nd=2)}) | {verdict(s, p)} |"
        )
    return "\n".join(lines)


def budget_table(results: list[dict]) -> str:
    """The BoR policy moved to the paper's mean depth with the serve-time knob, picked on the
    training split (never the test split): found % at equal or lower mean K, as the goal asks."""
    lines = [
        "| condition | paper BoR found % @ mean K | ours at the paper's budget: found % | mean K | "
        "depth_bias per seed (picked on train) | efficiency | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for res in results:
        p = PAPER.get(res["condition"])
        if p is None:
            continue
        reps = res["seeds"]
        pol = [_get(r, "BoR DQN @ paper budget") for r in reps]
        s = {"bor_found": [x["found"] for x in pol], "bor_k": [x["mean_k"] for x in pol]}
        biases = ", ".join(f"{r['budget_bias']:+g}" for r in reps)
        lines.append(
            f"| {res['condition']} | {p['bor'][0]:.1f} @ {p['bor'][1]:.1f} | {_ms(s['bor_found'], 100)} | "
            f"{_ms(s['bor_k'], nd=2)} | {biases} | {_ms([x['efficiency'] for x in pol], nd=2)} | "
            f"{verdict(s, p)} |"
        )
    return "\n".join(lines)


def bucket_table(result: dict) -> str:
    reps = result["seeds"]
    names = [b[0] for b in reps[0]["buckets"]]
    lines = ["| policy | " + " | ".join(
        f"{n} (n={_get(reps[0], 'BoR DQN')['buckets'][i]['n']})" for i, n in enumerate(names)) + " |",
        "|---|" + "---|" * len(names)]
    for pol in ("BoR DQN", "F1 DQN", "gap", "fixed K=1", "fixed K=5"):
        cells = []
        for i in range(len(names)):
            ks = [_get(r, pol)["buckets"][i]["mean_k"] for r in reps]
            fs = [_get(r, pol)["buckets"][i]["found"] for r in reps]
            if any(math.isnan(x) for x in ks):
                cells.append("–")
            else:
                cells.append(f"K {_ms(ks, nd=1)} / {_ms(fs, 100)}%")
        lines.append(f"| {pol} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "generated")
    ap.add_argument("--img", type=Path, default=ROOT / "docs" / "img" / "paper")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--only", nargs="*", default=None, help="condition names to run (default all)")
    ap.add_argument("--embedder-cache", type=Path, default=ROOT / "data" / "cache" / "embedder")
    ap.add_argument("--table-cache", type=Path, default=ROOT / "data" / "cache" / "scores")
    args = ap.parse_args()
    torch.set_num_threads(1)
    embedder = load_minilm(args.embedder_cache)
    tables: dict[tuple[str, int | None], object] = {}
    results = []
    started = time.perf_counter()
    for cond in CONDITIONS:
        if args.only and cond.name not in args.only:
            continue
        key = (cond.dataset, cond.max_queries)
        if key not in tables:
            tables[key] = load_or_build_table(args.shared / cond.dataset, embedder, cache_dir=args.table_cache,
                                              max_queries=cond.max_queries, seed=0)
        print(f"{cond.name}", file=sys.stderr, flush=True)
        results.append(run_condition(cond, tables[key], args.seeds, args.steps, args.img))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "paper.json").write_text(json.dumps(json_safe(results), indent=1) + "\n")
    md = ["# Table 2 reproduction (generated by bench/studies/reproduce_paper.py)", "",
          f"Seeds {args.seeds}; test-set metrics; mean ± std over seeds. "
          "Efficiency = K_eq / mean K (K_eq: fixed depth with the same found rate, interpolated).", "",
          paper_table(results), "",
          "## At the paper's depth budget", "",
          "The same BoR policy with its serve-time knob (`depth_bias`) set, on the training split only, "
          "to the bias that finds most often at a training mean K no larger than the paper's.", "",
          budget_table(results), ""]
    for res in results:
        if any(c.name == res["condition"] and c.figure1 for c in CONDITIONS):
            md += [f"## Difficulty buckets: {res['condition']}", "", bucket_table(res), ""]
    (args.out / "paper.md").write_text("\n".join(md))
    print(f"done in {time.perf_counter() - started:.0f}s -> {args.out / 'paper.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
