"""The LOSO table of the fine-tune: plain hybrid MiniLM (same queries, same run) vs fp32 vs int8.

Reads the per-fold records :func:`registry.offline.finetune_loso.run_finetune_loso` appends, so
a run cut short still reports the folds it finished.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from registry.index.hybrid import HYBRID_ALPHA
from registry.offline.corpus_vectors import SourceVectors
from registry.offline.loso_report import loso_report
from registry.offline.ranking import SourceScore


def read_folds(progress: Path) -> list[dict[str, Any]]:
    """The per-fold records appended so far (none when the file does not exist yet)."""
    lines = Path(progress).read_text(encoding="utf-8").splitlines() if Path(progress).is_file() else []
    return [json.loads(line) for line in lines if line.strip()]


def _score(record: dict[str, Any]) -> SourceScore:
    return SourceScore(
        record["source"], record["n_queries"], record["found_at_1"], record["found_at_5"],
        record["n_multi"], record["recall_at_5_multi"],
    )


def finetune_table(
    sources: Sequence[SourceVectors], progress: Path, *, fixed_alpha: bool = False
) -> tuple[str, dict[str, Any]]:
    """Markdown table per held-out source and pooled, and the same figures as JSON.

    The fp32 export is the tuned column, the int8 export its own (:func:`loso_report`).
    ``fixed_alpha``: the fine-tune scored at today's alpha (:data:`HYBRID_ALPHA`) instead of the
    alpha each fold picked on its train sources.
    """
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
    fold_figures = {
        "folds": [f["test"] for f in folds],
        "fold_alpha": {"-".join(f["test"]): f["alpha"] for f in folds},
        "fold_seconds": {"-".join(f["test"]): f["seconds"] for f in folds},
    }
    return loso_report(sources, fp32, alpha, folds=fold_figures, int8=int8, label="fine-tuned")
