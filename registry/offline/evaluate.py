"""Benchmark evaluation of depth policies: per-policy reports, Markdown tables and plots (the
``shortlist evaluate`` CLI: :mod:`registry.offline.evaluate_cli`).

Score tables and episodes come from :mod:`registry.offline.score_tables` and
:mod:`registry.offline.tables`, the metrics from :mod:`registry.offline.metrics`, the tables
and figures of the report from :mod:`registry.offline.evaluation_report` (all re-exported
here). The pipeline, each step usable on its own (no HTTP, no FastAPI)::

    table = score_table(data_dir, embedder)           # every query x every tool, base scorers
    ranked = rank_table(table, "hybrid")              # episodes: top scores + gold ranks
    report = evaluate_ranked(ranked, policies)        # found / K / BoR / efficiency / buckets
    write_report(reports, out_dir)                    # results.json, results.md, PNG plots

**Data format** (a directory): ``tools.json`` (any tool JSON the service accepts) and
``queries.jsonl`` with ``{"id", "query", "gold": [names], "gold_alternatives"?: [[names]]}``.
A shown tool is an *exact* hit when it is in ``gold``; it is an *equivalence-aware* hit when
it is in ``gold`` or in any ``gold_alternatives`` group (tools that do the job equally well).
Both found rates are reported side by side; BoR uses ``R_q`` = the size of the hit set.

**Any and all.** A query with several gold tools is a multi-tool task. *Found* (any) means at
least one gold tool is shown; *all found* means every gold tool is shown, i.e. at depth ``K``
every gold rank is ``< K``. Equivalence-aware "all" counts a gold tool as shown when it or one
of its equivalents is (:func:`registry.offline.datasets.needed_groups`); equivalence-aware "any" keeps
the flat hit set. ``BoR_all`` uses ``P_rand_all(N, R_q, K) = C(N-R_q, K-R_q) / C(N, K)``.
On single-gold queries the two coincide.

**Depth efficiency.** For a policy with found rate ``F`` at mean depth ``K_p``, ``K_eq`` is
the fixed depth whose found rate equals ``F``, linearly interpolated on the fixed-K curve
``found(K), K = 0, 1, ..., cap`` (``found(0) = 0``), and efficiency ``= K_eq / K_p``: how many
times more tools a fixed top-K must show to find as often. It is ``inf`` when no fixed depth
up to the cap finds as often.

**Candidate sets** (the paper's protocol): ``candidate_episodes`` builds, per query, a set of
``N`` tools = the gold tools + the highest-scoring non-gold tools ("hard distractors") + random
fill from the rest of the registry, and ranks only those; ``P_rand`` is then computed against
``N``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from registry.offline.evaluation_report import (
    markdown_tables,
    plot_report,
    write_report,
)
from registry.offline.metrics import (
    DEFAULT_CAP,
    NEEDS,
    PolicyFn,
    depth_efficiency,
    fixed_curve,
    fixed_found_at,
    found_bits,
    found_bits_all,
    k_equivalent,
    needed_ranks,
    policy_depths,
)
from registry.offline.score_tables import ScoreTable, score_table
from registry.offline.tables import RankedSet, candidate_episodes, load_or_build_table, rank_table

__all__ = [
    "DEFAULT_BUCKETS",
    "FIXED_KS",
    "NEEDS",
    "RankedSet",
    "ScoreTable",
    "candidate_episodes",
    "depth_efficiency",
    "evaluate_ranked",
    "fixed_curve",
    "fixed_found_at",
    "k_equivalent",
    "load_or_build_table",
    "markdown_tables",
    "needed_ranks",
    "plot_report",
    "policy_depths",
    "policy_metrics",
    "rank_table",
    "score_table",
    "write_report",
]

FIXED_KS: tuple[int, ...] = (1, 3, 5, 10, 20, 50)
# Difficulty buckets by the 1-based rank of the best gold tool (paper section 4):
# easy = 1st, medium = 2nd-5th, hard = 6th-20th, very hard = 21st and below.
DEFAULT_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("easy", 1, 1),
    ("medium", 2, 5),
    ("hard", 6, 20),
    ("very hard", 21, None),
)

# ----------------------------------------------------------------------------- metrics


def _bucket_of(rank1: int, buckets: Sequence[tuple[str, int, int | None]]) -> str | None:
    for name, lo, hi in buckets:
        if rank1 >= lo and (hi is None or rank1 <= hi):
            return name
    return None


def policy_metrics(
    name: str,
    ks: np.ndarray,
    ranked: RankedSet,
    cap: int,
    *,
    buckets: Sequence[tuple[str, int, int | None]] = DEFAULT_BUCKETS,
    curves: tuple[np.ndarray, np.ndarray] | None = None,
    all_curves: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Found rates (any and all, exact and equivalence-aware), depth statistics, BoR, efficiency.

    Keys: ``found``, ``found_equiv``, ``mean_k``, ``k_std``, ``k_median``, ``distinct_k``,
    ``mean_p_rand``, ``bor_bits`` (exact hits), ``k_eq``, ``efficiency`` and their
    ``*_equiv`` twins, ``fixed_found_at_mean_k`` (fixed curve interpolated at ``mean_k``),
    and ``buckets``: per difficulty bucket of the exact gold rank, ``n``, ``mean_k``, ``found``,
    ``found_all``.

    Every needed tool shown ("all"): ``found_all``, ``found_all_equiv``, ``n_multi_gold``
    (episodes with >= 2 gold tools), ``mean_p_rand_all``, ``bor_bits_all`` (exact),
    ``k_eq_all`` / ``efficiency_all`` (and ``*_equiv``) on the fixed all-found curve,
    ``fixed_found_all_at_mean_k`` and ``found_all_margin`` (``found_all`` minus it).
    ``curves`` / ``all_curves``: precomputed (exact, equiv) fixed curves, any / all.
    """
    ks = np.asarray(ks, dtype=np.int64)
    exact, equiv = ranked.exact, ranked.equiv
    needed_eq = ranked.needed_equiv()
    curve, curve_eq = curves if curves is not None else (fixed_curve(exact, cap), fixed_curve(equiv, cap))
    if all_curves is None:
        all_curves = (fixed_curve(exact, cap, need="all"), fixed_curve(needed_eq, cap, need="all"))
    curve_all, curve_all_eq = all_curves
    found, mean_pr, bits = found_bits(exact, ks)
    found_eq, _, bits_eq = found_bits(equiv, ks)
    found_all, mean_pr_all, bits_all = found_bits_all(exact, ks)
    found_all_eq = needed_ranks(needed_eq, "all") < ks
    mean_k = float(ks.mean())
    rate, rate_eq = float(found.mean()), float(found_eq.mean())
    rate_all, rate_all_eq = float(found_all.mean()), float(found_all_eq.mean())
    rows = []
    ranks1 = np.array([e.first_gold_rank + 1 for e in exact])
    for bname, _, _ in buckets:
        sel = np.array([_bucket_of(int(r), buckets) == bname for r in ranks1], dtype=bool)
        n = int(sel.sum())
        rows.append(
            {
                "bucket": bname,
                "n": n,
                "mean_k": float(ks[sel].mean()) if n else math.nan,
                "found": float(found[sel].mean()) if n else math.nan,
                "found_all": float(found_all[sel].mean()) if n else math.nan,
            }
        )
    k_eq = k_equivalent(curve, rate)
    k_eq_eq = k_equivalent(curve_eq, rate_eq)
    k_eq_all = k_equivalent(curve_all, rate_all)
    k_eq_all_eq = k_equivalent(curve_all_eq, rate_all_eq)
    fixed_all_at = fixed_found_at(curve_all, mean_k)
    return {
        "policy": name,
        "n": len(exact),
        "found": rate,
        "found_equiv": rate_eq,
        "mean_k": mean_k,
        "k_std": float(ks.std()),
        "k_median": float(np.median(ks)),
        "distinct_k": int(np.unique(ks).size),
        "mean_p_rand": mean_pr,
        "bor_bits": bits,
        "bor_bits_equiv": bits_eq,
        "k_eq": k_eq,
        "efficiency": depth_efficiency(curve, rate, mean_k),
        "k_eq_equiv": k_eq_eq,
        "efficiency_equiv": depth_efficiency(curve_eq, rate_eq, mean_k),
        "fixed_found_at_mean_k": fixed_found_at(curve, mean_k),
        "n_multi_gold": int(sum(1 for e in exact if e.n_gold >= 2)),
        "found_all": rate_all,
        "found_all_equiv": rate_all_eq,
        "mean_p_rand_all": mean_pr_all,
        "bor_bits_all": bits_all,
        "k_eq_all": k_eq_all,
        "efficiency_all": depth_efficiency(curve_all, rate_all, mean_k),
        "k_eq_all_equiv": k_eq_all_eq,
        "efficiency_all_equiv": depth_efficiency(curve_all_eq, rate_all_eq, mean_k),
        "fixed_found_all_at_mean_k": fixed_all_at,
        "found_all_margin": rate_all - fixed_all_at,
        "buckets": rows,
    }


def evaluate_ranked(
    ranked: RankedSet,
    policies: Mapping[str, PolicyFn],
    *,
    cap: int = DEFAULT_CAP,
    fixed_ks: Sequence[int] = FIXED_KS,
    buckets: Sequence[tuple[str, int, int | None]] = DEFAULT_BUCKETS,
    progress: bool = False,
) -> dict[str, Any]:
    """Evaluate fixed-K baselines and ``policies`` on one ranked data set.

    Args:
        ranked: the data set's episodes.
        policies: name -> ``(scores, n_tools, max_k) -> depth``.
        cap: the ``max_k`` every policy gets (the service default is 20).
        fixed_ks: fixed depths to report (those above ``cap`` are skipped).
        buckets: difficulty buckets ``(name, lowest rank, highest rank or None)``, 1-based.
        progress: tqdm bar over policies.

    Returns:
        ``{"dataset", "scorer", "n_tools", "n", "cap", "fixed_curve", "fixed_curve_equiv",
        "found_at": {1, 5, 10}, "policies": [metrics...]}``; fixed-K rows come first. Every
        needed tool shown: ``"n_multi_gold"``, ``"fixed_curve_all"``,
        ``"fixed_curve_all_equiv"``, ``"found_all_at": {1, 5, 10}``.
    """
    curve = fixed_curve(ranked.exact, cap)
    curve_eq = fixed_curve(ranked.equiv, cap)
    all_curves = (
        fixed_curve(ranked.exact, cap, need="all"),
        fixed_curve(ranked.needed_equiv(), cap, need="all"),
    )
    curves = {"curves": (curve, curve_eq), "all_curves": all_curves}
    rows = []
    for k in fixed_ks:
        if k > cap:
            continue
        ks = np.array([min(k, e.scores.size, e.n_tools) for e in ranked.exact], dtype=np.int64)
        rows.append(policy_metrics(f"fixed K={k}", ks, ranked, cap, buckets=buckets, **curves))
    items: Iterable[tuple[str, PolicyFn]] = policies.items()
    if progress:
        from tqdm import tqdm

        items = tqdm(list(items), desc=f"policies {ranked.name}", unit="policy")
    for name, fn in items:
        ks = policy_depths(fn, ranked.exact, cap)
        rows.append(policy_metrics(name, ks, ranked, cap, buckets=buckets, **curves))
    firsts = needed_ranks(ranked.exact, "any")
    lasts = needed_ranks(ranked.exact, "all")
    return {
        "dataset": ranked.name,
        "scorer": ranked.scorer,
        "n_tools": ranked.n_tools_label,
        "n": len(ranked.exact),
        "cap": cap,
        "meta": ranked.meta,
        "fixed_curve": curve.tolist(),
        "fixed_curve_equiv": curve_eq.tolist(),
        "found_at": {str(k): float((firsts < k).mean()) for k in (1, 5, 10)},
        "n_multi_gold": int(sum(1 for e in ranked.exact if e.n_gold >= 2)),
        "fixed_curve_all": all_curves[0].tolist(),
        "fixed_curve_all_equiv": all_curves[1].tolist(),
        "found_all_at": {str(k): float((lasts < k).mean()) for k in (1, 5, 10)},
        "buckets": [list(b) for b in buckets],
        "policies": rows,
    }
