"""The one LOSO report builder behind the adapter's and the fine-tune's tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from registry.index.hybrid import HYBRID_ALPHA
from registry.offline.corpus import Fold
from registry.offline.corpus_vectors import SourceVectors
from registry.offline.finetune_report import finetune_table
from registry.offline.ranking import FoldResult, SourceScore, score_ranks, score_source
from registry.offline.train_embedder import loso_table


def _unit(a: np.ndarray) -> np.ndarray:
    return (a / np.linalg.norm(a, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture
def sources() -> list[SourceVectors]:
    """Four small sources; ``a`` and ``c`` are multi-tool (a third of their queries need two)."""
    rng = np.random.default_rng(0)
    out = []
    for i, name in enumerate("abcd"):
        gold = tuple((j % 30,) if (i % 2 or j % 3) else (j % 30, (j + 1) % 30) for j in range(20))
        out.append(SourceVectors(
            name, _unit(rng.normal(size=(30, 8))), _unit(rng.normal(size=(20, 8))),
            rng.random((20, 30)).astype(np.float32), gold,
        ))
    return out


def _bumped(score: SourceScore, found_at_1: float) -> dict[str, object]:
    return {
        "source": score.source, "n_queries": score.n_queries, "found_at_1": found_at_1,
        "found_at_5": score.found_at_5, "n_multi": score.n_multi,
        "recall_at_5_multi": score.recall_at_5_multi,
    }


def test_adapter_table_columns_and_figures(sources: list[SourceVectors]) -> None:
    results = [
        FoldResult(Fold(test, ()), alpha, np.eye(2), [1.0],
                   [score_source(sv, None, alpha) for sv in sources if sv.name in test])
        for test, alpha in ((("a", "b"), 0.6), (("c", "d"), 1.0))
    ]
    table, figures = loso_table(sources, results)
    lines = table.splitlines()
    assert lines[0] == (
        "| source (held out) | queries | found@1 base | found@1 tuned | delta | found@5 base | "
        "found@5 tuned | recall@5 multi base | recall@5 multi tuned | alpha |"
    )
    assert lines[1].count("---") == 10
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| a", "| b", "| c", "| d", "| **pooled**"]
    assert lines[3].endswith("| - | - | 0.6 |")  # b is not multi-tool
    assert lines[-1].endswith(" | |")
    assert list(figures) == [
        "baseline", "pooled_found_at_1", "pooled_found_at_5", "multi_tool_sources",
        "multi_tool_recall_at_5", "worst_source", "per_source", "folds",
    ]
    assert figures["multi_tool_sources"] == ["a", "c"]
    assert set(figures["pooled_found_at_1"]) == {"base", "tuned"}
    assert figures["per_source"]["c"]["alpha"] == 1.0
    assert "int8_found_at_1" not in figures["per_source"]["a"]
    assert figures["folds"] == [["a", "b"], ["c", "d"]]


def test_finetune_table_adds_int8_and_reads_what_folds_finished(
    sources: list[SourceVectors], tmp_path: Path
) -> None:
    progress = tmp_path / "folds.jsonl"
    records = []
    for test, alpha in ((("a", "b"), 0.6), (("c",), 1.0)):
        scores = [score_source(sv, None, HYBRID_ALPHA) for sv in sources if sv.name in test]
        records.append({
            "test": list(test), "alpha": alpha, "seconds": 12.5,
            "fp32": [_bumped(s, 0.5) for s in scores], "int8": [_bumped(s, 0.4) for s in scores],
            "fp32_fixed": [_bumped(s, 0.3) for s in scores], "int8_fixed": [_bumped(s, 0.3) for s in scores],
        })
    progress.write_text("".join(json.dumps(r) + "\n" for r in records))
    table, figures = finetune_table(sources, progress)
    lines = table.splitlines()
    assert lines[0].split(" | ")[3:7] == ["found@1 fine-tuned", "delta", "found@1 int8", "int8 - fp32"]
    assert lines[0].endswith("| recall@5 multi int8 | alpha |")
    assert lines[1].count("---") == 13
    assert len(lines) == 2 + 3 + 1  # d's fold has not finished: a, b, c and pooled
    pooled_cells = lines[-1].split(" | ")
    assert pooled_cells[3] == "50.0" and pooled_cells[5:7] == ["40.0", "-10.0"]
    assert list(figures)[:4] == ["baseline", "folds", "fold_alpha", "fold_seconds"]
    assert figures["pooled_found_at_1"]["int8"] == pytest.approx(0.4)
    assert figures["per_source"]["b"]["int8_found_at_1"] == pytest.approx(0.4)
    assert figures["per_source"]["c"]["alpha"] == 1.0
    _, fixed = finetune_table(sources, progress, fixed_alpha=True)
    assert {s["alpha"] for s in fixed["per_source"].values()} == {HYBRID_ALPHA}
    assert fixed["pooled_found_at_1"]["tuned"] == pytest.approx(0.3)


def test_score_ranks_counts_the_best_needed_tool_and_the_share_of_needed_tools_in_the_top_5():
    ranks = [np.array([0]), np.array([5]), np.array([1, 7]), np.array([2, 4])]
    s = score_ranks("x", ranks)
    assert (s.source, s.n_queries, s.n_multi) == ("x", 4, 2)
    assert s.found_at_1 == 0.25 and s.found_at_5 == 0.75
    assert s.recall_at_5_multi == 0.75  # (1/2 + 2/2) / 2
