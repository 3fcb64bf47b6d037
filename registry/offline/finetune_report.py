"""The LOSO table of the fine-tune: plain hybrid MiniLM (same queries, same run) vs fp32 vs int8.

Reads the per-fold records :func:`registry.offline.finetune_loso.run_finetune_loso` appends, so
a run cut short still reports the folds it finished.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from registry.index.hybrid import HYBRID_ALPHA
from registry.offline.corpus_vectors import SourceVectors
from registry.offline.ranking import SourceScore, pooled, score_source

MULTI_TOOL_SHARE = 0.1  # a source is multi-tool when at least this share of its queries is


def read_folds(progress: Path) -> list[dict[str, Any]]:
    lines = Path(progress).read_text(encoding="utf-8").splitlines() if Path(progress).is_file() else []
    return [json.loads(line) for line in lines if line.strip()]


def _score(record: dict[str, Any]) -> SourceScore:
    return SourceScore(
        record["source"], record["n_queries"], record["found_at_1"], record["found_at_5"],
        record["n_multi"], record["recall_at_5_multi"],
    )


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}"


def finetune_table(
    sources: Sequence[SourceVectors], progress: Path, *, fixed_alpha: bool = False
) -> tuple[str, dict[str, Any]]:
    """Markdown table per held-out source and pooled, and the same figures as JSON.

    ``fixed_alpha``: the fine-tune scored at today's alpha (:data:`HYBRID_ALPHA`) instead of the
    alpha each fold picked on its train sources.
    """
    by_name = {sv.name: sv for sv in sources}
    fp32: dict[str, SourceScore] = {}
    int8: dict[str, SourceScore] = {}
    alpha: dict[str, float] = {}
    folds = read_folds(progress)
    suffix = "_fixed" if fixed_alpha else ""
    for fold in folds:
        for rec in fold["fp32" + suffix]:
            fp32[rec["source"]] = _score(rec)
            alpha[rec["source"]] = HYBRID_ALPHA if fixed_alpha else fold["alpha"]
        for rec in fold["int8" + suffix]:
            int8[rec["source"]] = _score(rec)
    names = [sv.name for sv in sources if sv.name in fp32]
    base = {n: score_source(by_name[n], None, HYBRID_ALPHA) for n in names}
    multi = [n for n in names if by_name[n].multi_tool.mean() >= MULTI_TOOL_SHARE]
    lines = [
        "| source (held out) | queries | found@1 base | found@1 fine-tuned | delta | found@1 int8 | "
        "int8 - fp32 | found@5 base | found@5 fine-tuned | recall@5 multi base | "
        "recall@5 multi fine-tuned | recall@5 multi int8 | alpha |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in names:
        b, t, q = base[n], fp32[n], int8[n]
        is_multi = n in multi
        lines.append(
            f"| {n} | {b.n_queries} | {_pct(b.found_at_1)} | {_pct(t.found_at_1)} | "
            f"{100 * (t.found_at_1 - b.found_at_1):+.1f} | {_pct(q.found_at_1)} | "
            f"{100 * (q.found_at_1 - t.found_at_1):+.1f} | {_pct(b.found_at_5)} | {_pct(t.found_at_5)} | "
            f"{_pct(b.recall_at_5_multi) if is_multi else '-'} | "
            f"{_pct(t.recall_at_5_multi) if is_multi else '-'} | "
            f"{_pct(q.recall_at_5_multi) if is_multi else '-'} | {alpha[n]} |"
        )
    pb, pt, pq = (pooled([d[n] for n in names]) for d in (base, fp32, int8))
    mb, mt, mq = (pooled([d[n] for n in multi]) for d in (base, fp32, int8)) if multi else ({}, {}, {})
    nan = float("nan")
    lines.append(
        f"| **pooled** | {sum(base[n].n_queries for n in names)} | {_pct(pb['found_at_1'])} | "
        f"{_pct(pt['found_at_1'])} | {100 * (pt['found_at_1'] - pb['found_at_1']):+.1f} | "
        f"{_pct(pq['found_at_1'])} | {100 * (pq['found_at_1'] - pt['found_at_1']):+.1f} | "
        f"{_pct(pb['found_at_5'])} | {_pct(pt['found_at_5'])} | "
        f"{_pct(mb.get('recall_at_5_multi', nan))} | {_pct(mt.get('recall_at_5_multi', nan))} | "
        f"{_pct(mq.get('recall_at_5_multi', nan))} | |"
    )
    worst = min(names, key=lambda n: fp32[n].found_at_1 - base[n].found_at_1) if names else None
    figures = {
        "baseline": f"hybrid MiniLM, alpha {HYBRID_ALPHA}",
        "folds": [f["test"] for f in folds],
        "fold_alpha": {"-".join(f["test"]): f["alpha"] for f in folds},
        "fold_seconds": {"-".join(f["test"]): f["seconds"] for f in folds},
        "pooled_found_at_1": {"base": pb["found_at_1"], "tuned": pt["found_at_1"], "int8": pq["found_at_1"]},
        "pooled_found_at_5": {"base": pb["found_at_5"], "tuned": pt["found_at_5"], "int8": pq["found_at_5"]},
        "multi_tool_sources": multi,
        "multi_tool_recall_at_5": {
            "base": mb.get("recall_at_5_multi", nan),
            "tuned": mt.get("recall_at_5_multi", nan),
            "int8": mq.get("recall_at_5_multi", nan),
        },
        "worst_source": None
        if worst is None
        else {"source": worst, "delta": fp32[worst].found_at_1 - base[worst].found_at_1},
        "per_source": {
            n: {
                "base_found_at_1": base[n].found_at_1,
                "tuned_found_at_1": fp32[n].found_at_1,
                "int8_found_at_1": int8[n].found_at_1,
                "base_recall_at_5_multi": base[n].recall_at_5_multi,
                "tuned_recall_at_5_multi": fp32[n].recall_at_5_multi,
                "alpha": alpha[n],
            }
            for n in names
        },
    }
    return "\n".join(lines), figures
