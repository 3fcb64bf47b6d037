"""Fit the coverage model (registry.serving.coverage) leave-one-source-out on a peers.py dump.

    nice -n 10 python bench/peers.py --embedding-cache data/cache/emb --max-queries 200 \\
        --json out/peers.json --dump out/peers.jsonl          # coverage off: the training rows
    nice -n 10 python bench/studies/coverage_loso.py --dump out/peers.jsonl --out data/models/coverage \\
        [--export models/coverage.json]
    nice -n 10 python bench/peers.py ... --coverage-dir data/models/coverage  # the held-out check

The dump holds, per request, the composed default list (coverage off), the hybrid ranking's
first 20 tools and scores, and the gold tools. For each source S: the logistic model is fitted
on the rows of every other source (one row per ranking position, label "a needed tool",
weight 1 / needed tools), the two cut-offs are chosen on those same sources from a grid
(``--grid-add``, ``--grid-drop``) by the goal progress of issue 19 (clipped: multi-tool sources
``min(recall - frontier, .05) + min(all - frontier, .05)`` plus small penalties below 95% of
hybrid top-8's recall or 25% token saving; single-tool sources ``min(any - frontier, 0)`` plus
a small penalty below efficiency 1.3), and the model is written to ``<out>/<S>.json``. The
source itself is never read for the fit. Printed per source: the cut-offs picked and the
simulated figures on S before and after (``bench/peers.py --coverage-dir`` measures them
through the real engine). ``--export`` fits on all sources and writes the shipped model.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import DEEP_K, MULTI_SHARE, SCORER_NAMES, Slot, efficiency, source_dirs  # noqa: E402
from bench.common import score_slots as _score  # noqa: E402
from registry.serving.coverage import CoverageModel, coverage_features  # noqa: E402
from registry.serving.depth_policies import policy_depth_limit  # noqa: E402
from registry.serving.needs import request_signals  # noqa: E402

GRID_ADD = (0.08, 0.11, 0.15, 0.25, 0.35, 0.5, 1.1)  # 1.1: never extend
GRID_DROP = (0.0, 0.02, 0.04, 0.06, 0.08, 0.12)  # 0: never trim
CAP = 20


class Source:
    """One source's dump rows with their features, labels and fixed-K curves."""

    def __init__(self, name: str, rows: list[dict[str, Any]], tokens: dict[str, float]) -> None:
        self.name, self.rows, self.tokens = name, rows, tokens
        self.golds = [set(r["gold"]) for r in rows]
        self.features = []
        self.labels = []
        for r, gold in zip(rows, self.golds):
            offered = {n for n, _ in r["ours"]} | {a for _, alts in r["ours"] for a in alts}
            shown = [name in offered for name, _ in r["hybrid"]]
            x = coverage_features(np.asarray(r["hybrid_scores"]), r["n_tools"], request_signals(r["query"]),
                                  shown, len(r["ours"]))
            self.features.append(x)
            self.labels.append(np.array([float(n in gold) for n, _ in r["hybrid"][: x.shape[0]]]))
        self.multi = float(np.mean([len(g) > 1 for g in self.golds])) >= MULTI_SHARE
        self.curves: dict[str, dict[str, np.ndarray]] = {}
        for s in SCORER_NAMES:
            self.curves[s] = {m: np.zeros(DEEP_K + 1) for m in ("any", "recall", "all", "tokens")}
            for k in range(1, DEEP_K + 1):
                scored = [_score([(n, tuple(a)) for n, a in r[s][:k]], g, tokens) for r, g in zip(rows, self.golds)]
                for m in self.curves[s]:
                    self.curves[s][m][k] = float(np.mean([x[m] for x in scored]))

    def lists(self, model: CoverageModel | None) -> list[list[Slot]]:
        """Each request's list as the engine would serve it with ``model`` (None: as dumped)."""
        out = []
        for r, x in zip(self.rows, self.features):
            ours: list[Slot] = [(n, tuple(a)) for n, a in r["ours"]]
            if model is None:
                out.append(ours)
                continue
            names = [n for n, _ in r["hybrid"]]
            index = {n: i for i, n in enumerate(dict.fromkeys([*names, *(n for n, _ in ours)]))}
            inverse = {i: n for n, i in index.items()}
            offered = {index.get(a, -1) for _, alts in ours for a in alts} | {index[n] for n, _ in ours}
            n = r["n_tools"]
            limit = min(CAP, policy_depth_limit(n), n - 1 if n > 1 else n)
            kept = model.refine([index[n] for n, _ in ours], [index[n] for n in names[: x.shape[0]]],
                                model.probabilities(x), keep=set(), offered=offered, trim=not r["intents"],
                                limit=limit)
            alts = {nm: tuple(a) for nm, a in ours}
            out.append([(inverse[t], alts.get(inverse[t], ())) for t in kept])
        return out

    def figures(self, lists: Sequence[Sequence[Slot]]) -> dict[str, Any]:
        ours = [_score(lst, g, self.tokens) for lst, g in zip(lists, self.golds)]
        mean = {m: float(np.mean([o[m] for o in ours])) for m in ("any", "recall", "all", "k", "tokens")}
        grid = np.arange(DEEP_K + 1)
        front = {m: max(float(np.interp(mean["k"], grid, self.curves[s][m])) for s in SCORER_NAMES)
                 for m in ("any", "recall", "all")}
        top8 = self.curves["hybrid"]
        return {
            "ours": mean, "frontier": front, "multi_tool": self.multi,
            "recall_vs_frontier": mean["recall"] - front["recall"], "all_vs_frontier": mean["all"] - front["all"],
            "any_vs_frontier": mean["any"] - front["any"],
            "recall_share_of_top8": mean["recall"] / top8["recall"][8] if top8["recall"][8] else 0.0,
            "token_saving_vs_top8": 1 - mean["tokens"] / top8["tokens"][8] if top8["tokens"][8] else 0.0,
            "efficiency": efficiency(self.curves["hybrid"]["any"], mean["any"], mean["k"]),
        }


def progress(f: dict[str, Any]) -> float:
    """Goal progress of one source, clipped at each goal (see the module docstring)."""
    if f["multi_tool"]:
        return (min(f["recall_vs_frontier"], 0.05) + min(f["all_vs_frontier"], 0.05)
                + 0.2 * min(f["recall_share_of_top8"] - 0.95, 0.0) + 0.2 * min(f["token_saving_vs_top8"] - 0.25, 0.0))
    return min(f["any_vs_frontier"], 0.0) + 0.05 * min(f["efficiency"] - 1.3, 0.0)


def fit(train: Sequence[Source], grid_add: Sequence[float], grid_drop: Sequence[float]) -> CoverageModel:
    """The model fitted on ``train`` and the cut-offs of the best summed progress on ``train``."""
    x = np.vstack([f for s in train for f in s.features])
    y = np.concatenate([lab for s in train for lab in s.labels])
    w = np.concatenate([np.full(lab.size, 1.0 / len(g)) for s in train for lab, g in zip(s.labels, s.golds)])
    model = CoverageModel.fit(x, y, w, tau_add=1.1, tau_drop=0.0)
    best, best_score = model, -np.inf
    for tau_add in grid_add:
        for tau_drop in grid_drop:
            candidate = model.with_cutoffs(tau_add, tau_drop)
            score = sum(progress(s.figures(s.lists(candidate))) for s in train)
            if score > best_score:
                best, best_score = candidate, score
    return best


def load_sources(dump: Path) -> list[Source]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in dump.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        by[row["source"]].append(row)
    out = []
    for directory in source_dirs():
        if directory.name in by:
            tools = json.loads((directory / "tools.json").read_text(encoding="utf-8"))
            tokens = {t["name"]: len(json.dumps(t, ensure_ascii=False)) / 4 for t in tools}
            out.append(Source(directory.name, by[directory.name], tokens))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", type=Path, required=True, help="bench/peers.py --dump of the default, coverage off")
    ap.add_argument("--out", type=Path, required=True, help="directory of the per-source held-out models")
    ap.add_argument("--export", type=Path, default=None, help="also fit on all sources and write this file")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    sources = load_sources(args.dump)
    args.out.mkdir(parents=True, exist_ok=True)
    report = []
    for held in sources:
        model = fit([s for s in sources if s is not held], GRID_ADD, GRID_DROP)
        model.save(args.out / f"{held.name}.json", trained_on=[s.name for s in sources if s is not held])
        before, after = held.figures(held.lists(None)), held.figures(held.lists(model))
        report.append({"source": held.name, "tau_add": model.tau_add, "tau_drop": model.tau_drop,
                       "before": before, "after": after})
        print(f"{held.name}: tau_add {model.tau_add} tau_drop {model.tau_drop} | "
              + " | ".join(f"{tag} K {f['ours']['k']:.2f} recall {f['recall_vs_frontier']:+.3f} "
                           f"all {f['all_vs_frontier']:+.3f} any {f['any_vs_frontier']:+.3f} "
                           f"eff {f['efficiency']:.2f}" for tag, f in (("before", before), ("after", after))),
              flush=True)
    if args.export:
        model = fit(sources, GRID_ADD, GRID_DROP)
        model.save(args.export, trained_on=[s.name for s in sources], dump=str(args.dump),
                   command="python bench/studies/coverage_loso.py --dump DUMP --out DIR --export " + str(args.export))
        print(f"exported {args.export}: tau_add {model.tau_add} tau_drop {model.tau_drop}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"dump": str(args.dump), "sources": report}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
