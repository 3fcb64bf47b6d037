"""The LOSO report of a tuned embedder: per held-out source and pooled, against hybrid MiniLM.

One builder for both trained embedders: the adapter (:func:`registry.offline.train_embedder.
loso_table`) and the fine-tune (:func:`registry.offline.finetune_report.finetune_table`, which
adds the int8 export's column). The baseline is plain hybrid MiniLM at :data:`HYBRID_ALPHA`,
scored here on the same queries. found@1 and found@5 are over all queries; recall@5 is over the
multi-tool queries of the multi-tool sources (at least :data:`MULTI_TOOL_SHARE` of their queries).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from registry.index.hybrid import HYBRID_ALPHA
from registry.offline.corpus_vectors import SourceVectors
from registry.offline.ranking import SourceScore, pooled, score_source

MULTI_TOOL_SHARE = 0.1  # a source is multi-tool when at least this share of its queries is


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}"


def loso_report(
    sources: Sequence[SourceVectors],
    tuned: Mapping[str, SourceScore],
    alpha: Mapping[str, float],
    *,
    folds: Mapping[str, Any] | None = None,
    int8: Mapping[str, SourceScore] | None = None,
    label: str = "tuned",
) -> tuple[str, dict[str, Any]]:
    """Markdown table (per source and pooled) and the same figures as JSON.

    Args:
        sources: every source, in table order; those without a ``tuned`` score are left out.
        tuned: the tuned embedder's score per held-out source.
        alpha: the fusion weight each held-out source was scored at.
        folds: what the run records about its folds (e.g. ``{"folds": [...]}``), placed in the
            figures right after ``baseline``.
        int8: the int8 export's score per source; adds the ``found@1 int8``, ``int8 - fp32`` and
            ``recall@5 multi int8`` columns and an ``int8`` entry to the pooled figures.
        label: the tuned embedder's name in the column headers (``tuned``, ``fine-tuned``).

    Raises:
        ZeroDivisionError: when no source has a ``tuned`` score (nothing to pool).
    """
    by_name = {sv.name: sv for sv in sources}
    names = [sv.name for sv in sources if sv.name in tuned]
    base = {n: score_source(by_name[n], None, HYBRID_ALPHA) for n in names}
    multi = [n for n in names if by_name[n].multi_tool.mean() >= MULTI_TOOL_SHARE]
    columns = {"base": base, "tuned": tuned, **({"int8": int8} if int8 is not None else {})}
    nan = float("nan")
    pool = {k: pooled([d[n] for n in names]) for k, d in columns.items()}
    pool_multi = {
        k: pooled([d[n] for n in multi])["recall_at_5_multi"] if multi else nan
        for k, d in columns.items()
    }
    for k in columns:
        pool[k]["recall_at_5_multi"] = pool_multi[k]

    header = ["source (held out)", "queries", "found@1 base", f"found@1 {label}", "delta"]
    header += ["found@1 int8", "int8 - fp32"] if int8 is not None else []
    header += ["found@5 base", f"found@5 {label}", "recall@5 multi base", f"recall@5 multi {label}"]
    header += ["recall@5 multi int8"] if int8 is not None else []
    lines = ["| " + " | ".join([*header, "alpha"]) + " |", "| --- |" + " ---: |" * len(header)]

    def row(head: str, queries: int, figures: dict[str, dict[str, float]], alpha_cell: str) -> str:
        """One table row from the ``found_at_1``/``found_at_5``/``recall_at_5_multi`` of each column."""
        b, t, q = figures["base"], figures["tuned"], figures.get("int8")
        cells = [head, str(queries), _pct(b["found_at_1"]), _pct(t["found_at_1"]),
                 f"{100 * (t['found_at_1'] - b['found_at_1']):+.1f}"]
        if q is not None:
            cells += [_pct(q["found_at_1"]), f"{100 * (q['found_at_1'] - t['found_at_1']):+.1f}"]
        cells += [_pct(b["found_at_5"]), _pct(t["found_at_5"])]
        cells += [_pct(f["recall_at_5_multi"]) for f in figures.values()]
        return "| " + " | ".join(cells) + (f" | {alpha_cell} |" if alpha_cell else " | |")

    for n in names:
        per_column = {
            k: {"found_at_1": d[n].found_at_1, "found_at_5": d[n].found_at_5,
                "recall_at_5_multi": d[n].recall_at_5_multi if n in multi else nan}
            for k, d in columns.items()
        }
        lines.append(row(n, base[n].n_queries, per_column, str(alpha[n])))
    lines.append(row("**pooled**", sum(base[n].n_queries for n in names), pool, ""))
    worst = min(names, key=lambda n: tuned[n].found_at_1 - base[n].found_at_1)
    per_source: dict[str, dict[str, float]] = {}
    for n in names:
        per_source[n] = {"base_found_at_1": base[n].found_at_1, "tuned_found_at_1": tuned[n].found_at_1}
        if int8 is not None:
            per_source[n]["int8_found_at_1"] = int8[n].found_at_1
        per_source[n] |= {
            "base_recall_at_5_multi": base[n].recall_at_5_multi,
            "tuned_recall_at_5_multi": tuned[n].recall_at_5_multi,
            "alpha": alpha[n],
        }
    figures = {
        "baseline": f"hybrid MiniLM, alpha {HYBRID_ALPHA}",
        **(folds or {}),
        "pooled_found_at_1": {k: p["found_at_1"] for k, p in pool.items()},
        "pooled_found_at_5": {k: p["found_at_5"] for k, p in pool.items()},
        "multi_tool_sources": multi,
        "multi_tool_recall_at_5": pool_multi,
        "worst_source": {"source": worst, "delta": tuned[worst].found_at_1 - base[worst].found_at_1},
        "per_source": per_source,
    }
    return "\n".join(lines), figures
