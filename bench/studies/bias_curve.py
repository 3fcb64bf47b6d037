"""The serve-time operating knob (``depth_bias``) measured out of sample: the curve it traces
and whether a bias picked on the training sets carries over to a left-out set.

    python bench/studies/leave_one_out.py        # first: trains the fold policies into data/loo/
    python bench/studies/bias_curve.py --out docs/generated --img docs/img

For every leave-one-dataset-out fold (``bench/studies/leave_one_out.py``: trained on two dev sets, the
fourth fold on all three and tested on BFCL live) the fold's policy is run at every bias of
``--biases`` on its training sets and on its left-out set (full registries, cap 20). The
table gives, per left-out set, found % @ mean K (efficiency) at each bias; ``*`` marks found
>= fixed K=3. "Picked on training sets" applies a rule that never sees the left-out set: the
bias with the best mean training efficiency among those finding at least fixed K=3 on every
training set. The plot draws each left-out set's fixed-K curve with the bias points on it.
About 1 minute once the score tables are cached.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.common import DEV, FOLDS  # noqa: E402
from registry.index.embedders import load_minilm  # noqa: E402
from registry.offline.evaluate import load_or_build_table, rank_table  # noqa: E402
from registry.offline.metrics import (  # noqa: E402
    DEFAULT_CAP,
    depth_efficiency,
    fixed_curve,
    found_rate,
    policy_depths,
)
from registry.serving.depth_policies import OnnxDepthPolicy  # noqa: E402

BIASES = (-0.5, -0.25, -0.1, 0.0, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5)
DATA = {**DEV, "live": ROOT / "data" / "bfcl_live"}


def point(policy: OnnxDepthPolicy, episodes: list, curve: np.ndarray, bias: float, cap: int) -> dict:
    ks = policy_depths(functools.partial(policy.choose_depth, bias=bias), episodes, cap)
    found, mean_k = found_rate(episodes, ks), float(ks.mean())
    return {"bias": bias, "found": found, "mean_k": mean_k, "efficiency": depth_efficiency(curve, found, mean_k),
            "above_fk3": found >= curve[3] - 1e-12}


def pick(train_points: list[list[dict]]) -> float | None:
    """The bias with the best mean training efficiency among those >= FK=3 on every training set."""
    ok = [i for i in range(len(BIASES)) if all(pts[i]["above_fk3"] for pts in train_points)]
    if not ok:
        return None
    return BIASES[max(ok, key=lambda i: np.mean([pts[i]["efficiency"] for pts in train_points]))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=ROOT / "data" / "loo", help="leave_one_out.py --work")
    ap.add_argument("--cap", type=int, default=DEFAULT_CAP)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "generated")
    ap.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--embedder-cache", type=Path, default=ROOT / "data" / "cache" / "embedder")
    ap.add_argument("--table-cache", type=Path, default=ROOT / "data" / "cache" / "scores")
    args = ap.parse_args()
    embedder = load_minilm(args.embedder_cache)
    episodes, curves = {}, {}
    for name, path in DATA.items():
        table = load_or_build_table(path, embedder, cache_dir=args.table_cache, max_queries=2000)
        episodes[name] = [e for e in rank_table(table, "hybrid").exact if e.n_gold > 0]
        curves[name] = fixed_curve(episodes[name], args.cap)

    rows = []
    for train, held in FOLDS:
        policy_dir = args.work / f"policy-{'+'.join(train)}"
        if not (policy_dir / "manifest.json").exists():
            raise SystemExit(f"{policy_dir} is missing: run python bench/studies/leave_one_out.py first")
        policy = OnnxDepthPolicy.from_dir(policy_dir)
        pts = {n: [point(policy, episodes[n], curves[n], b, args.cap) for b in BIASES] for n in [*train, held]}
        chosen = pick([pts[n] for n in train])
        rows.append({"train": train, "held": held, "points": pts, "picked": chosen,
                     "fk3": float(curves[held][3]), "curve": curves[held].tolist()})
        print(held, "picked", chosen, file=sys.stderr, flush=True)

    def cell(p: dict) -> str:
        return f"{100 * p['found']:.1f} @ {p['mean_k']:.2f} ({p['efficiency']:.2f}{'*' if p['above_fk3'] else ''})"

    md = ["| left out (trained on) | FK=3 | " + " | ".join(f"bias {b:+g}" for b in BIASES)
          + " | picked on training sets |", "|---|---|" + "---|" * (len(BIASES) + 1)]
    for r in rows:
        held_pts = r["points"][r["held"]]
        picked = "none" if r["picked"] is None else (
            f"{r['picked']:+g}: " + cell(held_pts[BIASES.index(r["picked"])]))
        md.append(f"| {r['held']} ({' + '.join(r['train'])}) | {100 * r['fk3']:.1f} | "
                  + " | ".join(cell(p) for p in held_pts) + f" | {picked} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bias_curve.md").write_text("\n".join(md) + "\n")
    (args.out / "bias_curve.json").write_text(json.dumps(rows, indent=1, default=float) + "\n")
    print("\n".join(md))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.8))
    for ax, r in zip(np.atleast_1d(axes), rows):
        curve = np.array(r["curve"])
        ax.plot(np.arange(1, curve.size), 100 * curve[1:], "-", color="0.6", label="fixed K")
        held_pts = r["points"][r["held"]]
        ax.plot([p["mean_k"] for p in held_pts], [100 * p["found"] for p in held_pts], "o-", label="bor, bias sweep")
        zero = held_pts[BIASES.index(0.0)]
        ax.plot([zero["mean_k"]], [100 * zero["found"]], "s", color="k", label="bias 0")
        ax.set_xscale("log")
        ax.set_title(f"{r['held']} (trained on {'+'.join(r['train'])})", fontsize=9)
        ax.set_xlabel("mean K")
        ax.set_ylabel("found %")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    args.img.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.img / "bias_curve.png", dpi=110)
    print(f"wrote {args.out / 'bias_curve.md'} and {args.img / 'bias_curve.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()
