"""``shortlist evaluate``: depth policies evaluated on labelled data sets, written as JSON,
Markdown and PNG plots (the evaluation itself: :mod:`registry.offline.evaluate`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from registry.index.hybrid import SCORERS
from registry.offline.evaluate import DEFAULT_BUCKETS, evaluate_ranked
from registry.offline.evaluation_report import format_value, write_report
from registry.offline.metrics import DEFAULT_CAP, DEFAULT_SCORER, PolicyFn
from registry.offline.tables import candidate_episodes, load_or_build_table, rank_table

__all__ = ["load_policies", "main", "missing_inputs"]


def load_policies(paths: Sequence[Path | str], biases: Sequence[float] = (0.0,)) -> dict[str, PolicyFn]:
    """ONNX depth policies by display name ``<manifest name>:<directory name>``.

    Each policy is run at every operating-knob value in ``biases`` (bits, see
    :func:`registry.serving.depth_policies.first_stop`); a non-zero bias is appended to the name,
    e.g. ``bor:default@+0.25``.
    """
    import functools

    from registry.serving.depth_policies import OnnxDepthPolicy

    out: dict[str, PolicyFn] = {}
    for path in paths:
        policy = OnnxDepthPolicy.from_dir(path)
        base = f"{policy.name}:{Path(path).resolve().name}"
        while any(name.split("@")[0] == base for name in out):
            base += "'"
        for bias in biases:
            name = base if bias == 0 else f"{base}@{bias:+g}"
            out[name] = functools.partial(policy.choose_depth, bias=float(bias))
    return out


def _parse_buckets(text: str | None) -> tuple[tuple[str, int, int | None], ...]:
    """``"1,2-5,6-20,21+"`` -> buckets named easy / medium / hard / very hard (or by range)."""
    if not text:
        return DEFAULT_BUCKETS
    parts = [p.strip() for p in text.split(",") if p.strip()]
    names = ["easy", "medium", "hard", "very hard"] if len(parts) == 4 else [None] * len(parts)
    out = []
    for name, part in zip(names, parts):
        if part.endswith("+"):
            lo, hi = int(part[:-1]), None
        elif "-" in part:
            a, b = part.split("-", 1)
            lo, hi = int(a), int(b)
        else:
            lo = hi = int(part)
        out.append((name or part, lo, hi))
    return tuple(out)


def missing_inputs(data: Sequence[Path], policies: Sequence[Path]) -> str | None:
    """One line naming the first input that is not there (checked before any slow work)."""
    for directory in data:
        if not directory.is_dir():
            return f"--data {directory}: no such directory"
        for name in ("tools.json", "queries.jsonl"):
            if not (directory / name).is_file():
                return f"--data {directory}: no {name} in it (a data directory holds tools.json + queries.jsonl)"
    for directory in policies:
        if not (directory / "manifest.json").is_file():
            return f"--policy {directory}: no manifest.json in it (a policy directory holds manifest.json + policy.onnx)"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Evaluate depth policies on labelled data sets; write JSON, Markdown and PNG plots."""
    import argparse
    import logging
    import sys

    from registry.offline.cli_support import HelpFormatter, ProgressEmbedder, plain, progress_step
    from registry.request import MAX_DEPTH_BIAS
    from registry.serving.depth_policies import GapPolicy, ThresholdPolicy

    log = logging.getLogger(__name__)
    ap = argparse.ArgumentParser(
        prog="shortlist evaluate", description=plain(main.__doc__), formatter_class=HelpFormatter
    )
    ap.add_argument("--data", nargs="+", type=Path, required=True,
                    help="data directories (tools.json + queries.jsonl)")
    ap.add_argument("--policy", nargs="*", type=Path, default=[],
                    help="ONNX policy directories (manifest.json + policy.onnx; default: none, baselines only)")
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--scorer", default=DEFAULT_SCORER, choices=SCORERS, help="scorer ranking the tools")
    ap.add_argument("--cap", type=int, default=DEFAULT_CAP, help="max_k given to every policy")
    ap.add_argument("--candidates", type=int, default=None,
                    help="rank each query over N candidates (gold + hard distractors + random fill) "
                    "instead of the full registry (default: the full registry)")
    ap.add_argument("--hard", type=int, default=None,
                    help="hard distractors per candidate set (default: all, no random fill)")
    ap.add_argument("--max-queries", type=int, default=None, help="sample this many queries per data set (default: all)")
    ap.add_argument("--seed", type=int, default=0, help="query sample / random fill seed")
    ap.add_argument("--threshold", type=float, default=0.35, help="score cut-off of the threshold baseline")
    ap.add_argument("--depth-bias", nargs="+", type=float, default=[0.0], metavar="BITS",
                    help="evaluate every --policy at these operating-knob values (bits; > 0 longer "
                         "lists, < 0 shorter; the service's depth_bias)")
    ap.add_argument("--buckets", default=None, help="difficulty buckets by gold rank, e.g. 1,2-3,4-10,11+ (default: none)")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    ap.add_argument("--img", type=Path, default=None, help="write the PNG plots here (default --out)")
    ap.add_argument("--embedder-cache", type=Path, default=None,
                    help="MiniLM ONNX cache (default: the service's, <data_dir>/cache/embedder)")
    ap.add_argument("--table-cache", type=Path, default=None,
                    help="cache score tables here (skips re-embedding on a re-run; default: no cache)")
    args = ap.parse_args(argv)
    missing = missing_inputs(args.data, args.policy)
    if missing:
        print(f"shortlist evaluate: {missing}", file=sys.stderr)
        return 2

    embedder = None
    if args.scorer != "bm25":
        from registry.index.embedders import load_minilm
        from registry.settings import Settings

        with progress_step(log, "loading the MiniLM embedder (exported to ONNX on first use)"):
            embedder = ProgressEmbedder(
                load_minilm(args.embedder_cache or Settings().resolved_embedder_cache()), log
            )
    buckets = _parse_buckets(args.buckets)
    policies: dict[str, PolicyFn] = {
        "gap": GapPolicy().choose_depth,
        f"threshold {args.threshold:g}": ThresholdPolicy(args.threshold).choose_depth,
    }
    if any(not -MAX_DEPTH_BIAS <= b <= MAX_DEPTH_BIAS for b in args.depth_bias):
        ap.error(f"--depth-bias values must lie between -{MAX_DEPTH_BIAS:g} and {MAX_DEPTH_BIAS:g} bits")
    policies.update(load_policies(args.policy, args.depth_bias))
    reports = []
    from tqdm import tqdm

    for directory in tqdm(args.data, desc="data sets", unit="set"):
        table = load_or_build_table(
            directory, embedder, cache_dir=args.table_cache, max_queries=args.max_queries,
            seed=args.seed, progress=True,
        )
        with progress_step(log, f"ranking {table.name} ({table.n_queries:,} queries, {args.scorer})"):
            if args.candidates:
                ranked = candidate_episodes(
                    table, args.scorer, args.candidates, n_hard=args.hard, seed=args.seed
                )
            else:
                ranked = rank_table(table, args.scorer, depth=max(60, args.cap + 3))
        reports.append(
            evaluate_ranked(ranked, policies, cap=args.cap, buckets=buckets, progress=True)
        )
    with progress_step(log, f"writing the report{'' if args.no_plots else ' and plots'} to {args.out}"):
        paths = write_report(reports, args.out, plots=not args.no_plots, img_dir=args.img)
    for rep in reports:
        best = [p for p in rep["policies"] if not p["policy"].startswith("fixed")]
        for p in best:
            print(
                f"{rep['dataset']:>20s}  {p['policy']:<24s} found {100 * p['found']:5.1f}%  "
                f"all found {100 * p['found_all']:5.1f}% (fixed K at mean K: "
                f"{100 * p['fixed_found_all_at_mean_k']:5.1f}%)  "
                f"mean K {p['mean_k']:5.2f}  efficiency {format_value(p['efficiency'])}",
                file=sys.stderr,
            )
    print(f"wrote {paths['markdown']} and {paths['json']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
