"""Depth policies on small registries: sub-registries of 8, 20 and 50 tools carved from held-out queries.

    python bench/studies/registry_size.py --policy old=data/models/old_default new=data/models/carve70 \\
        --out docs/generated/registry_size

For each dev set (BFCL simple, MetaTool's 2,000-query sample, StableToolBench) the HELD-OUT
30% of queries (:func:`registry.offline.train.holdout_rows`, the split ``shortlist train`` uses
with seed 0) is carved (``registry/offline/carve.py``) into sub-registries of 8, 20 and 50 tools
with each fill kind (random, same group, nearest neighbours), ranked with the hybrid scorer
(BM25 recomputed on the sub-corpus). Every policy gets the service cap 20. Per (set, N, fill)
and pooled it prints found (any gold shown), all-found (every gold shown), mean K, the share
of answers that are the whole registry, fixed K=1/3/5 found and depth efficiency (K_eq /
mean K, :func:`registry.offline.evaluate.depth_efficiency`); then the same on the held-out queries over
each FULL registry (large registries must not get worse). ``--unseen DIR`` adds a data set no
policy trained on (BFCL live, ``bench/studies/convert_bfcl_live.py``): all its queries, carved and full.

``--policy NAME=DIR`` loads an ONNX artifact; ``NAME=DIR:nocap`` replays it without the
whole-registry guarantee (:func:`registry.serving.depth_policies.policy_depth_limit`), i.e. as it was
served before it (use it for the old shipped artifact). Keep a copy of the old artifact, e.g.
``git show <rev>:models/default/policy.onnx``, or ``cp -r models/default data/models/old_default``
before retraining.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from registry.offline.carve import FILL_KINDS, carve_grid, load_source  # noqa: E402
from registry.offline.episodes import Episode  # noqa: E402
from registry.offline.metrics import (  # noqa: E402
    DEFAULT_CAP,
    PolicyFn,
    depth_efficiency,
    fixed_curve,
    found_rate,
    policy_depths,
)
from registry.offline.tables import load_or_build_table, rank_table  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
DEV = [SHARED / "bfcl_simple", SHARED / "metatool", SHARED / "toolbench_stable"]
SIZES = (8, 20, 50)
CAP = DEFAULT_CAP

def metrics(fn: PolicyFn, eps: Sequence[Episode], cap: int = CAP) -> dict[str, float]:
    """found / all-found / mean K / whole-registry share / efficiency of one policy on ``eps``."""
    ks = policy_depths(fn, eps, cap)
    n = np.array([e.n_tools for e in eps])
    found = found_rate(eps, ks)
    mean_k = float(ks.mean())
    return {
        "found": found,
        "all_found": found_rate(eps, ks, need="all"),
        "mean_k": mean_k,
        "whole": float((ks >= n).mean()),
        "efficiency": depth_efficiency(fixed_curve(eps, cap), found, mean_k),
    }


def fixed(eps: Sequence[Episode], ks: Sequence[int] = (1, 3, 5)) -> dict[str, float]:
    curve = fixed_curve(eps, max(ks))
    return {f"fk{k}": float(curve[k]) for k in ks}


def load_policy(spec: str) -> tuple[str, PolicyFn]:
    from registry.serving.depth_policies import OnnxDepthPolicy

    name, _, path = spec.partition("=")
    nocap = path.endswith(":nocap")
    policy = OnnxDepthPolicy.from_dir(path.removesuffix(":nocap"))
    policy.limit_depth = not nocap
    return name, policy.choose_depth


def goals(row: dict[str, Any], name: str) -> str:
    """Which issue-10 goals the row meets for policy ``name`` (whole <= 1%; found >= FK3 with
    mean K <= 2.5; efficiency >= 1.3 where FK1 < 90%)."""
    p = row[name]
    marks = ["W" if p["whole"] <= 0.01 else "w"]
    marks.append("F" if p["found"] >= row["fk3"] - 1e-12 and p["mean_k"] <= 2.5 else "f")
    if row["fk1"] < 0.9:
        marks.append("E" if p["efficiency"] >= 1.3 else "e")
    return "".join(marks)


def table_md(rows: list[dict[str, Any]], names: list[str]) -> str:
    head = "| set | N | fill | n | FK=1 | FK=3 | FK=5 | " + " | ".join(
        f"{n}: found / all / K / whole / eff" for n in names
    ) + f" | goals ({names[-1]}) |"
    out = [head, "|" + "---|" * (8 + len(names))]
    for r in rows:
        cells = [
            f"{100 * r[n]['found']:.1f} / {100 * r[n]['all_found']:.1f} / {r[n]['mean_k']:.2f} / "
            f"{100 * r[n]['whole']:.1f}% / {r[n]['efficiency']:.2f}"
            for n in names
        ]
        out.append(
            f"| {r['set']} | {r['n_tools']} | {r['fill']} | {r['n']} | {100 * r['fk1']:.1f} | "
            f"{100 * r['fk3']:.1f} | {100 * r['fk5']:.1f} | " + " | ".join(cells) + f" | {goals(r, names[-1])} |"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", nargs="+", required=True, help="NAME=DIR or NAME=DIR:nocap, e.g. new=models/default")
    ap.add_argument("--data", nargs="*", type=Path, default=DEV)
    ap.add_argument("--unseen", nargs="*", type=Path, default=[],
                    help="data sets no policy trained on (e.g. data/bfcl_live): every query is evaluated")
    ap.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    ap.add_argument("--max-queries", type=int, default=2000, help="per set, as the training recipe samples")
    ap.add_argument("--holdout-fraction", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0, help="split seed (the recipe's --seed)")
    ap.add_argument("--carve-seed", type=int, default=0)
    ap.add_argument("--table-cache", type=Path, default=ROOT / "data" / "cache" / "scores")
    ap.add_argument("--out", type=Path, default=None, help="write registry_size.md / .json here")
    args = ap.parse_args(argv)

    from registry.index.embedders import load_minilm
    from registry.offline.train import holdout_rows
    from registry.settings import Settings

    embedder = load_minilm(Settings().resolved_embedder_cache())
    policies = dict(load_policy(s) for s in args.policy)
    names = list(policies)
    carved_rows: list[dict[str, Any]] = []
    full_rows: list[dict[str, Any]] = []
    pooled: dict[tuple[int | str, str], list[Episode]] = {}
    for directory in [*args.data, *args.unseen]:
        table = load_or_build_table(
            directory, embedder, cache_dir=args.table_cache, max_queries=args.max_queries, seed=args.seed
        )
        if directory in args.unseen:
            hold = [i for i in range(table.n_queries) if table.gold[i].size]
        else:
            _, hold = holdout_rows(table, args.holdout_fraction, args.seed)
        src = load_source(table, embedder, cache_dir=args.table_cache, seed=args.seed)
        grid = carve_grid(src, hold, args.sizes, FILL_KINDS, seed=args.carve_seed)
        for (n, kind), eps in grid.items():
            if not eps:
                continue
            if directory not in args.unseen:  # pooled = the dev sets' held-out queries
                pooled.setdefault((n, kind), []).extend(eps)
                pooled.setdefault(("all", "all"), []).extend(eps)
            row = {"set": table.name, "n_tools": n, "fill": kind, "n": len(eps), **fixed(eps)}
            row.update({name: metrics(fn, eps) for name, fn in policies.items()})
            carved_rows.append(row)
            print(f"{table.name} N={n} {kind}: " + ", ".join(
                f"{name} found {100 * row[name]['found']:.1f} K {row[name]['mean_k']:.2f}" for name in names
            ) + f" (FK3 {100 * row['fk3']:.1f})", file=sys.stderr, flush=True)
        full = rank_table(table, "hybrid", rows=hold).exact
        row = {"set": table.name, "n_tools": table.n_tools, "fill": "full registry", "n": len(full), **fixed(full)}
        row.update({name: metrics(fn, full) for name, fn in policies.items()})
        full_rows.append(row)
    pooled_rows = []
    for (n, kind), eps in sorted(pooled.items(), key=lambda kv: (str(kv[0][0]).zfill(4), kv[0][1])):
        row = {"set": "pooled", "n_tools": n, "fill": kind, "n": len(eps), **fixed(eps)}
        row.update({name: metrics(fn, eps) for name, fn in policies.items()})
        pooled_rows.append(row)

    md = "\n\n".join([
        (
            "Carved sub-registries (held-out queries, cap 20). Cells: found % / all-found % / mean K / "
            "whole-registry share / efficiency. Goals: W whole <= 1%, F found >= FK=3 with mean K <= 2.5, "
            "E efficiency >= 1.3 where FK=1 < 90% (lower case: missed)."
        ),
        table_md(carved_rows, names),
        "Pooled over sets",
        table_md(pooled_rows, names),
        "Full registries (held-out queries, cap 20)",
        table_md(full_rows, names),
    ])
    print(md)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "registry_size.md").write_text(md + "\n", encoding="utf-8")
        (args.out / "registry_size.json").write_text(
            json.dumps({"carved": carved_rows, "pooled": pooled_rows, "full": full_rows}, indent=1) + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
