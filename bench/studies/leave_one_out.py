"""Leave-one-dataset-out: train the default recipe on two dev sets, evaluate on the third.

    python bench/studies/leave_one_out.py --out docs/generated/loo --img docs/img/loo

Every fold runs the two CLI commands an operator would (``shortlist train`` with the shipped
recipe, ``shortlist evaluate`` over the left-out set's FULL registry with the service cap 20),
then writes ``loo.md``: found %, mean K and depth efficiency next to fixed K=3, per fold. The
fourth fold trains on all three dev sets (the shipped policy's recipe) and evaluates on BFCL
live, which no policy is trained on. About 3 minutes on one core.

``--pooled`` adds, to each fold's training data, the registry pooling the training sets' tools
(``bench/studies/merge_registries.py``, see PREPARE): larger N, out-of-domain distractors. It did not
help (docs/results/leave-one-out.md), so the shipped recipe does not use it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import DEV, FOLDS  # noqa: E402

# The default policy's recipe (also used for models/default, see MODEL_CARD.md).
RECIPE = [
    "--scorer", "hybrid", "--reward", "bor", "--step-cost", "0.01", "--gamma", "0.98",
    "--max-depth", "50", "--ensemble", "3", "--seed", "0", "--eval-cap", "20",
]

# Only for --pooled: the pooled registries (MetaTool: the recipe's 2,000-query sample).
PREPARE = """
python bench/studies/merge_registries.py ../shared/data/metatool --max-queries 2000 --out data/dev/metatool
python bench/studies/merge_registries.py ../shared/data/bfcl_simple data/dev/metatool --out data/merged/bfcl+meta
python bench/studies/merge_registries.py ../shared/data/bfcl_simple ../shared/data/toolbench_stable --out data/merged/bfcl+tool
python bench/studies/merge_registries.py data/dev/metatool ../shared/data/toolbench_stable --out data/merged/meta+tool
python bench/studies/merge_registries.py ../shared/data/bfcl_simple data/dev/metatool ../shared/data/toolbench_stable --out data/merged/bfcl+meta+tool
"""

def train_args(names: list[str], out: Path, table_cache: Path, pooled: bool, sizes: list[str]) -> list[str]:
    data = [str(DEV[n]) for n in names]
    if pooled:
        data = [str(ROOT / "data" / "dev" / "metatool") if n == "meta" else str(DEV[n]) for n in names]
        data.append(str(ROOT / "data" / "merged" / "+".join(names)))
    limit = "1000000" if pooled else "2000"  # pooled inputs are already sampled
    return ["train", "--data", *data, *RECIPE, "--candidate-sizes", *sizes, "--max-queries", limit,
            "--holdout-fraction", "0",
            "--table-cache", str(table_cache), "--out", str(out)]


def main() -> None:
    from service.cli import main as cli

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "generated" / "loo")
    ap.add_argument("--img", type=Path, default=ROOT / "docs" / "img" / "loo")
    ap.add_argument("--work", type=Path, default=ROOT / "data" / "loo")
    ap.add_argument("--table-cache", type=Path, default=ROOT / "data" / "cache" / "scores")
    ap.add_argument("--policy", type=Path, nargs="*", default=[ROOT / "models" / "default"],
                    help="also evaluate these policies on the left-out sets (e.g. the shipped one)")
    ap.add_argument("--pooled", action="store_true", help="also train on the pooled registries")
    ap.add_argument("--candidate-sizes", nargs="+", default=["full"],
                    help="train on candidate sets of these sizes (the recipe: full registries only)")
    ap.add_argument("--no-img", action="store_true", help="no plots")
    args = ap.parse_args()
    if args.pooled and not (ROOT / "data" / "merged" / "bfcl+meta+tool").is_dir():
        raise SystemExit(f"--pooled needs the pooled registries; run first:{PREPARE}")
    rows = []
    for train, left_out in FOLDS:
        name = "+".join(train)
        policy_dir = args.work / f"policy-{name}"
        commands = [train_args(train, policy_dir, args.table_cache, args.pooled, args.candidate_sizes)]
        target = ROOT / "data" / "bfcl_live" if left_out == "live" else DEV[left_out]
        eval_out = args.out / left_out
        commands.append(["evaluate", "--data", str(target), "--max-queries", "2000", "--policy", str(policy_dir),
                         *[str(p) for p in args.policy], "--scorer", "hybrid", "--cap", "20",
                         "--table-cache", str(args.table_cache), "--out", str(eval_out),
                         *(["--no-plots"] if args.no_img else ["--img", str(args.img)])])
        for cmd in commands:
            print("shortlist " + " ".join(cmd), file=sys.stderr, flush=True)
            if cli(cmd) != 0:
                raise SystemExit(f"failed: {cmd}")
        (rep,) = json.loads((eval_out / "results.json").read_text())
        by = {p["policy"]: p for p in rep["policies"]}
        loo = by[f"bor:{policy_dir.name}"]
        rows.append({"train": train, "left_out": rep["dataset"], "n": rep["n"], "n_tools": rep["n_tools"],
                     "policy": loo, "fk3": by["fixed K=3"]["found"], "fk1": by["fixed K=1"]["found"],
                     "fk5": by["fixed K=5"]["found"], "gap": by["gap"],
                     "shipped": {k: v for k, v in by.items() if k.startswith("bor:") and k != loo["policy"]}})

    lines = [
        "| trained on | evaluated on (full registry) | found % | mean K | efficiency | FK=1 | FK=3 | FK=5 | "
        "found >= FK=3? | eff >= 1.5? | gap cut-off found % @ K (eff.) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    sizes_note = "" if args.candidate_sizes == ["full"] else f", N in {{{', '.join(args.candidate_sizes)}}}"
    for r in rows:
        p, g = r["policy"], r["gap"]
        lines.append(
            f"| {' + '.join(r['train'])}{' (+ pooled)' if args.pooled else ''}{sizes_note} | {r['left_out']} (N={r['n_tools']}, {r['n']} q) | "
            f"{100 * p['found']:.1f} | {p['mean_k']:.2f} | {p['efficiency']:.2f} | {100 * r['fk1']:.1f} | "
            f"{100 * r['fk3']:.1f} | {100 * r['fk5']:.1f} | {'yes' if p['found'] >= r['fk3'] else 'no'} | "
            f"{'yes' if p['efficiency'] >= 1.5 else 'no'} | {100 * g['found']:.1f} @ {g['mean_k']:.2f} "
            f"({g['efficiency']:.2f}) |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loo.json").write_text(json.dumps(rows, indent=1, default=str) + "\n")
    (args.out / "loo.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
