"""Is the shipped depth policy worth retraining on the shipped ranker's scores? Leave-one-source-out.

    nice -n 10 python bench/studies/depth_retrain.py --workdir /tmp/depth --json out/depth_retrain.json \
        --extra bench/data/mcp_servers bench/data/mcp_servers_new_tasks

The shipped policy (``models/default``) learned its stop rule from plain MiniLM's hybrid scores on
the three dev sets; the service now ranks with the tuned fine-tune. This study retrains the same
recipe (``MODEL_CARD.md``: BoR reward floored at 1,024 tools, 6 carved sub-registries per query,
size gate 128/199, three seeds) on the **tuned** embedder's hybrid scores of the 16 sources
(the 13 sets of ``<shared>/train`` and the three dev sets), in grouped folds
(:func:`registry.offline.corpus.loso_folds`, 4 groups of similar size): each fold's policy never
saw its held-out sources. Training samples ``--train-queries`` requests per source (seed 0);
``<workdir>/fold-<n>`` holds each fold's artifact, so a rerun skips what is trained.

Both policies then serve the held-out sources through an in-process
:class:`registry.assembly.Registries` built as the service builds it (tuned embedder, multi-intent
composition, exploration off), ``--max-queries`` requests per source (seed 0, the sample of
``bench/peers.py``), beside the plain hybrid ranking cut at fixed K (``k=20``, the baseline, from
the same run). Per source and policy: the metric (single-tool sources: any needed tool shown;
multi-tool sources: recall and all-needed), the mean K, and the fixed-K list interpolated to that
mean K (linear between integer K). The margin is policy minus fixed-K at equal mean K; the
retrained policy wins a source when its margin is no more than 1 point below the shipped one's.
``--extra`` adds sources no fold trained on (the MCP task sets), served by the recipe trained on
all 16 (the artifact that would ship). Caveat: the tuned embedder trained on a sample of 13 of the
16 sources and mcp_servers, so the *ranker* is in-sample on those rows and only the stop rule is
held out (and the shipped policy is in-sample on the three dev sets).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    DEEP_K,
    MULTI_SHARE,
    Slot,
    answer_slots,
    disk_cached,
    policy_engine,
    score_slots,
    source_dirs,
)

#: the shipped recipe (models/default/MODEL_CARD.md), minus data, embedder and output
RECIPE = ["--scorer", "hybrid", "--reward", "bor", "--reward-min-n", "1024", "--step-cost", "0.01",
          "--gamma", "0.98", "--ensemble", "3", "--seed", "0", "--carve-per-query", "6",
          "--size-gate", "128", "199", "--eval-cap", "20", "--holdout-fraction", "0.3", "--refit-all"]


def _count(directory: Path) -> int:
    return sum(1 for line in (directory / "queries.jsonl").read_text(encoding="utf-8").splitlines() if line.strip())


def train_command(sources: Sequence[Path], out: Path, train_queries: int, table_cache: Path) -> list[str]:
    """The ``shortlist train`` command of one policy (a fold's, or the all-source artifact)."""
    return [sys.executable, "-m", "registry.offline.train_cli", "--data", *map(str, sources),
            "--max-queries", str(train_queries), *RECIPE, "--table-cache", str(table_cache),
            "--embedder", "tuned", "--out", str(out)]


def train_fold(sources: Sequence[Path], out: Path, train_queries: int, table_cache: Path) -> float:
    """Train one policy unless ``out`` already holds one; the seconds it took (0: reused)."""
    if (out / "manifest.json").is_file():
        return 0.0
    t0 = time.perf_counter()
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as fh:
        subprocess.run(train_command(sources, out, train_queries, table_cache), check=True, stdout=fh,
                       stderr=subprocess.STDOUT, cwd=ROOT)
    return time.perf_counter() - t0


def seed_tool_vectors(embedder: Any, directory: Path, scores: Path) -> int:
    """Put the tool vectors training already computed (``registry/offline/carve.py``'s cache, keyed
    by the tools' index texts and the model) into the disk cache, so the engines do not embed a
    registry again; the number of vectors added."""
    import hashlib

    from registry.offline.corpus import tool_texts
    from registry.offline.datasets import load_dataset

    texts = tool_texts(load_dataset(directory).tools)
    key = hashlib.sha256(("\0".join(texts) + "\0" + str(embedder.model_id)).encode()).hexdigest()[:16]
    path = scores / f"{directory.name}-tools-{key}.npy"
    if not path.is_file():
        return 0
    vectors = np.load(path, allow_pickle=False)
    for text, vector in zip(texts, vectors):
        embedder._vectors.setdefault(embedder._key(text), vector.astype(np.float32))
    return len(texts)


def evaluate_source(
    directory: Path, embedder: Any, policies: dict[str, Path], max_queries: int
) -> dict[str, Any]:
    """Each policy's figures on ``directory`` and the fixed-K hybrid list at its mean K."""
    from registry.errors import ValidationFailed
    from registry.offline.datasets import load_dataset
    from registry.request import ShortlistRequest

    tools = json.loads((directory / "tools.json").read_text(encoding="utf-8"))
    queries = [q for q in load_dataset(directory).queries if q.gold]
    if len(queries) > max_queries:
        queries = random.Random(0).sample(queries, max_queries)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in policies}
    deep: list[tuple[list[Slot], set[str]]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="depth-") as tmp:
        engines = {name: policy_engine(tools, "r", Path(tmp) / name, embedder, path) for name, path in policies.items()}
        first = next(iter(engines.values()))
        for q in queries:
            gold = set(q.gold)
            try:
                answers = {name: e.shortlist(ShortlistRequest("r", q.query)) for name, e in engines.items()}
                ranked = first.shortlist(ShortlistRequest("r", q.query, k=DEEP_K, scorer="hybrid"))
            except ValidationFailed:  # over max_query_chars: the service's 422, for every list alike
                continue
            for name, answer in answers.items():
                rows[name].append(score_slots(answer_slots(answer), gold, {}))
            deep.append((answer_slots(ranked), gold))
    curve = {m: np.zeros(DEEP_K + 1) for m in ("any", "recall", "all")}
    for k in range(1, DEEP_K + 1):
        scored = [score_slots(r[:k], g, {}) for r, g in deep]
        for m in curve:
            curve[m][k] = float(np.mean([s[m] for s in scored]))
    multi = float(np.mean([len(g) > 1 for _, g in deep]))
    out: dict[str, Any] = {"source": directory.name, "n_tools": len(tools), "n_queries": len(deep),
                           "multi_share": multi, "multi_tool": multi >= MULTI_SHARE,
                           "fixed_k": {m: c.tolist() for m, c in curve.items()}}
    for name, figures in rows.items():
        mean = {m: float(np.mean([f[m] for f in figures])) for m in ("any", "recall", "all", "k")}
        at_k = {m: float(np.interp(mean["k"], np.arange(DEEP_K + 1), curve[m])) for m in ("any", "recall", "all")}
        out[name] = {"policy": mean, "fixed_at_mean_k": at_k,
                     "margin": {m: mean[m] - at_k[m] for m in at_k}}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def _primary(row: dict[str, Any]) -> str:
    return "recall" if row["multi_tool"] else "any"


def verdict(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Ship rule: on no source a margin (found; recall and all-needed) more than 1 point below the
    shipped policy's, and the query-weighted pooled primary margin (found / recall) better."""
    def delta(r: dict[str, Any], m: str) -> float:
        return float(r["retrained"]["margin"][m] - r["shipped"]["margin"][m])

    deltas = {r["source"]: delta(r, _primary(r)) for r in rows}
    weights = {r["source"]: r["n_queries"] for r in rows}
    pooled = sum(deltas[s] * weights[s] for s in deltas) / max(1, sum(weights.values()))
    # a multi-tool source must not lose more than a point on all-needed either
    worse = sorted(r["source"] for r in rows
                   if any(delta(r, m) < -0.01 for m in (("recall", "all") if r["multi_tool"] else ("any",))))
    return {"deltas": deltas, "pooled_delta": pooled, "worse_than_1pt": worse,
            "ships": not worse and pooled > 0}


def markdown(rows: Sequence[dict[str, Any]], decision: dict[str, Any]) -> str:
    lines = [
        "| held-out source (tools, queries, multi-tool share) | fold | metric | shipped @ mean K | fixed K at that K "
        "| retrained @ mean K | fixed K at that K | margin shipped -> retrained (pts) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        metrics = ("recall", "all") if r["multi_tool"] else ("any",)
        for m in metrics:
            s, t = r["shipped"], r["retrained"]
            lines.append(
                f"| {r['source']} ({r['n_tools']}, {r['n_queries']}, {100 * r['multi_share']:.0f}%) | {r['fold']} | "
                f"{'found' if m == 'any' else m} | {100 * s['policy'][m]:.1f} @ {s['policy']['k']:.2f} | "
                f"{100 * s['fixed_at_mean_k'][m]:.1f} | {100 * t['policy'][m]:.1f} @ {t['policy']['k']:.2f} | "
                f"{100 * t['fixed_at_mean_k'][m]:.1f} | {100 * s['margin'][m]:+.1f} -> {100 * t['margin'][m]:+.1f} |"
            )
    lines.append("")
    lines.append(
        f"Pooled change of the primary margin (found on single-tool, recall on multi-tool sources, "
        f"query-weighted): {100 * decision['pooled_delta']:+.2f} points; sources more than 1 point worse: "
        f"{', '.join(decision['worse_than_1pt']) or 'none'}; ships: {'yes' if decision['ships'] else 'no'}."
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from registry.index.embedders import default_embedder
    from registry.offline.corpus import loso_folds
    from registry.settings import Settings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, required=True, help="fold policies, score tables, embeddings")
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--train-queries", type=int, default=600, help="requests sampled per source for training")
    ap.add_argument("--max-queries", type=int, default=300, help="held-out requests evaluated per source")
    ap.add_argument("--shipped", type=Path, default=ROOT / "models" / "default")
    ap.add_argument("--only-fold", type=int, nargs="*", default=None, help="train and evaluate only these folds")
    ap.add_argument("--train-only", action="store_true", help="train the fold policies and stop")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--extra", type=Path, nargs="*", default=[],
                    help="more sources no fold trained on (bench/data/mcp_servers ...), served by the policy "
                         "trained on all 16 (<workdir>/all, trained if missing)")
    ap.add_argument("--export", type=Path, default=None,
                    help="train the same recipe on all 16 sources into this directory and stop (the artifact)")
    args = ap.parse_args(argv)

    dirs = {d.name: d for d in source_dirs()}
    if args.export is not None:
        seconds = train_fold(list(dirs.values()), args.export, args.train_queries, args.workdir / "scores")
        print(f"all sources: trained in {seconds:.0f} s into {args.export}", file=sys.stderr)
        return 0
    folds = loso_folds({n: min(_count(d), args.max_queries) for n, d in dirs.items()}, args.folds)
    chosen = [i for i in range(len(folds)) if args.only_fold is None or i in args.only_fold]
    for i in chosen:
        fold, out = folds[i], args.workdir / f"fold-{i}"
        seconds = train_fold([dirs[n] for n in fold.train], out, args.train_queries, args.workdir / "scores")
        print(f"fold {i} (held out {', '.join(fold.test)}): "
              + (f"trained in {seconds:.0f} s" if seconds else "reused"), file=sys.stderr, flush=True)
    if args.train_only:
        return 0
    embedder = disk_cached(default_embedder(Settings(embedder="tuned")), args.workdir / "embeddings")
    rows: list[dict[str, Any]] = []
    for i in chosen:
        fold = folds[i]
        policies = {"shipped": args.shipped, "retrained": args.workdir / f"fold-{i}"}
        for name in fold.test:
            seed_tool_vectors(embedder, dirs[name], args.workdir / "scores")
            row = evaluate_source(dirs[name], embedder, policies, args.max_queries) | {"fold": i}
            rows.append(row)
            print(f"{name}: shipped {row['shipped']['policy']} retrained {row['retrained']['policy']} "
                  f"({row['seconds']} s)", file=sys.stderr, flush=True)
            embedder.save()
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps({"folds": [list(f.test) for f in folds], "rows": rows}, indent=2))
    if args.extra:  # never in any training set: served by the policy trained on all 16 sources
        every = args.workdir / "all"
        train_fold(list(dirs.values()), every, args.train_queries, args.workdir / "scores")
        for directory in args.extra:
            row = evaluate_source(directory, embedder, {"shipped": args.shipped, "retrained": every},
                                  args.max_queries) | {"fold": "all 16"}
            rows.append(row)
            embedder.save()
    decision = verdict(rows)
    if args.json:
        args.json.write_text(json.dumps({"folds": [list(f.test) for f in folds], "rows": rows,
                                         "decision": decision}, indent=2))
    print(markdown(rows, decision))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
