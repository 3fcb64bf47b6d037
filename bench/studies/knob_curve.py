"""The operating knob: how the step cost (and gamma) moves the BoR policy along found-vs-K.

Step cost shortens lists (1.0 gives K = 1 everywhere); the longer-list end is gamma (0.995,
1.0 at step cost 0), since a zero step cost alone still discounts depth through gamma.

    python bench/studies/knob_curve.py --out docs/generated --img docs/img

Trains the default recipe (hybrid scorer, BoR reward) on 70% of each dev set for several step
costs, evaluates on the held-out 30% of each set over its full registry (cap 20, as served), and
plots each policy as a point next to the fixed-K curve of the same queries. Operators who want
shorter or longer lists retrain with another ``--step-cost`` (``shortlist train``); the table
says what each value buys. About 2 minutes on one core.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from registry.index.embedders import load_minilm
from registry.offline.metrics import (
    DEFAULT_CAP,
    depth_efficiency,
    fixed_curve,
    found_rate,
    policy_depths,
)
from registry.offline.tables import load_or_build_table, rank_table
from registry.offline.train import data_episodes, train_ensemble

ROOT = Path(__file__).resolve().parents[2]
SETS = (("bfcl_simple", None), ("metatool", 2000), ("toolbench_stable", None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--step-costs", type=float, nargs="+", default=[1.0, 0.3, 0.1, 0.03, 0.01, 0.0])
    ap.add_argument("--gamma", type=float, default=0.98)
    ap.add_argument("--long-gammas", type=float, nargs="*", default=[0.995, 1.0],
                    help="then step cost 0 with these larger gammas: the longer-list end of the knob")
    ap.add_argument("--cap", type=int, default=DEFAULT_CAP)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "generated")
    ap.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--embedder-cache", type=Path, default=ROOT / "data" / "cache" / "embedder")
    ap.add_argument("--table-cache", type=Path, default=ROOT / "data" / "cache" / "scores")
    args = ap.parse_args()
    torch.set_num_threads(1)
    embedder = load_minilm(args.embedder_cache)
    tables, train_rows, test_rows = [], [], []
    for name, limit in SETS:
        t = load_or_build_table(args.shared / name, embedder, cache_dir=args.table_cache, max_queries=limit)
        order = np.random.default_rng(args.seed).permutation(t.n_queries)
        n_test = round(0.3 * t.n_queries)
        tables.append(t)
        test_rows.append(sorted(order[:n_test].tolist()))
        train_rows.append(sorted(order[n_test:].tolist()))
    train = data_episodes(tables, train_rows, "hybrid", ["full"], seed=args.seed)
    tests = {t.name: rank_table(t, "hybrid", rows=r).exact for t, r in zip(tables, test_rows)}
    pooled = [e for eps in tests.values() for e in eps]
    rows = []
    settings = [(c, args.gamma) for c in args.step_costs] + [(0.0, g) for g in args.long_gammas]
    for cost, gamma in settings:
        pol = train_ensemble(train, [args.seed], step_cost=cost, gamma=gamma, max_depth=50)
        row = {"step_cost": cost, "gamma": gamma}
        for name, eps in [*list(tests.items()), ("pooled", pooled)]:
            ks = policy_depths(pol.choose_depth, eps, args.cap)
            found = found_rate(eps, ks)
            curve = fixed_curve(eps, args.cap)
            row[name] = {"found": found, "mean_k": float(ks.mean()),
                         "efficiency": depth_efficiency(curve, found, float(ks.mean()))}
        rows.append(row)
        print(json.dumps(row))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "knob.json").write_text(json.dumps(rows, indent=1) + "\n")
    names = [t.name for t in tables] + ["pooled"]
    md = ["| step cost | gamma | " + " | ".join(f"{n}: found % @ mean K (eff.)" for n in names) + " |",
          "|---|---|" + "---|" * len(names)]
    for r in rows:
        md.append(f"| {r['step_cost']:g} | {r['gamma']:g} | " + " | ".join(
            f"{100 * r[n]['found']:.1f} @ {r[n]['mean_k']:.2f} ({r[n]['efficiency']:.2f})" for n in names) + " |")
    (args.out / "knob.md").write_text("\n".join(md) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 4))
    for ax, name in zip(axes, names):
        eps = pooled if name == "pooled" else tests[name]
        curve = fixed_curve(eps, args.cap)
        ax.plot(np.arange(1, args.cap + 1), 100 * curve[1:], "-", color="0.4", label="fixed K")
        xs = [r[name]["mean_k"] for r in rows]
        ys = [100 * r[name]["found"] for r in rows]
        ax.plot(xs, ys, "*-", color="tab:green", ms=10, label="BoR policy (step cost / gamma)")
        for r, x, y in zip(rows, xs, ys):
            label = f"{r['step_cost']:g}" if r["gamma"] == args.gamma else f"γ{r['gamma']:g}"
            ax.annotate(label, (x, y), fontsize=7, xytext=(4, -10), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel("mean K")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("found %")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Operating knob: step cost at gamma {args.gamma}, then gamma at step cost 0 "
                 f"(cap {args.cap}, held-out 30%)")
    fig.tight_layout()
    args.img.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.img / "knob_curve.png", dpi=110)
    print(f"wrote {args.out / 'knob.md'} and {args.img / 'knob_curve.png'}")


if __name__ == "__main__":
    main()
