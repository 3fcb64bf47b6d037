"""Training episodes for the depth policy: one ranked score list per query.

An episode is what the scorer produced for one query: the top ``L`` scores of the full
ranking (descending), the 0-based ranks of the relevant tools in that full ranking (which
may lie beyond ``L``, meaning "not reachable"), and the registry size ``N``.

Storage is one compressed ``.npz`` file: the score lists are concatenated into one float32
array with offsets (lists may have different lengths), gold ranks likewise, and ``meta`` is
stored as a JSON string inside the archive. No pickles, so loading is safe.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from registry.errors import ArtifactError
from registry.fsio import atomic_write_bytes

EPISODES_FORMAT_VERSION = 1


@dataclass
class Episode:
    """One query's ranking.

    Attributes:
        scores: float32, the top ``L`` scores of the full ranking, descending, ``L >= 1``.
        gold_ranks: int64, 0-based ranks of the relevant tools in the FULL ranking (may be
            ``>= L``: the gold tool exists but is not among the kept candidates).
        n_tools: registry (candidate-set) size ``N`` the ranking was made over.
        query_id: identifier of the query, for bookkeeping.
        signals: the request's :func:`registry.serving.needs.request_signals` (schema-2 training),
            or ``None``; kept in memory only, not written by :func:`save_episodes`.
    """

    scores: np.ndarray
    gold_ranks: np.ndarray
    n_tools: int
    query_id: str = ""
    signals: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.scores = np.asarray(self.scores, dtype=np.float32).reshape(-1)
        self.gold_ranks = np.asarray(self.gold_ranks, dtype=np.int64).reshape(-1)
        self.n_tools = int(self.n_tools)
        if self.scores.size < 1:
            raise ValueError(f"episode {self.query_id!r}: scores must not be empty")
        if self.n_tools < self.scores.size:
            raise ValueError(
                f"episode {self.query_id!r}: n_tools={self.n_tools} < len(scores)={self.scores.size}"
            )
        if self.gold_ranks.size and (
            self.gold_ranks.min() < 0 or self.gold_ranks.max() >= self.n_tools
        ):
            raise ValueError(f"episode {self.query_id!r}: gold rank outside [0, n_tools)")

    @property
    def n_gold(self) -> int:
        """``R_q``: the number of relevant tools."""
        return int(self.gold_ranks.size)

    @property
    def first_gold_rank(self) -> int:
        """0-based rank of the best-ranked gold tool, or ``n_tools`` when there is none."""
        return int(self.gold_ranks.min()) if self.gold_ranks.size else self.n_tools


def save_episodes(path: str | Path, episodes: Sequence[Episode], meta: dict[str, Any]) -> Path:
    """Write ``episodes`` and a JSON-serialisable ``meta`` dict to one compressed ``.npz``.

    Args:
        path: destination; written atomically (temp file + fsync + rename).
        episodes: the episodes.
        meta: free-form provenance (dataset, scorer, registry size, ...).

    Returns:
        The path written.
    """
    path = Path(path)
    score_len = np.array([e.scores.size for e in episodes], dtype=np.int64)
    gold_len = np.array([e.gold_ranks.size for e in episodes], dtype=np.int64)
    arrays: dict[str, np.ndarray] = {
        "format_version": np.array(EPISODES_FORMAT_VERSION, dtype=np.int64),
        "scores": (
            np.concatenate([e.scores for e in episodes]).astype(np.float32)
            if episodes
            else np.zeros(0, np.float32)
        ),
        "score_offsets": np.concatenate([[0], np.cumsum(score_len)]).astype(np.int64),
        "gold_ranks": (
            np.concatenate([e.gold_ranks for e in episodes]).astype(np.int64)
            if episodes
            else np.zeros(0, np.int64)
        ),
        "gold_offsets": np.concatenate([[0], np.cumsum(gold_len)]).astype(np.int64),
        "n_tools": np.array([e.n_tools for e in episodes], dtype=np.int64),
        "query_ids": np.array([e.query_id for e in episodes], dtype=np.str_),
        "meta_json": np.array(json.dumps(meta, sort_keys=True)),
    }
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]  # stub: **kwds may hit allow_pickle
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def load_episodes(path: str | Path) -> tuple[list[Episode], dict[str, Any]]:
    """Read a file written by :func:`save_episodes`.

    Raises:
        ArtifactError: the file is missing, unreadable or of another format version.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            version = int(z["format_version"])
            if version != EPISODES_FORMAT_VERSION:
                raise ArtifactError(
                    f"{path}: episodes format {version}, expected {EPISODES_FORMAT_VERSION}",
                    {"path": str(path)},
                )
            scores = z["scores"]
            so = z["score_offsets"]
            gold = z["gold_ranks"]
            go = z["gold_offsets"]
            n_tools = z["n_tools"]
            qids = z["query_ids"]
            meta = json.loads(str(z["meta_json"]))
    except ArtifactError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise ArtifactError(f"cannot read episodes file {path}: {exc}", {"path": str(path)}) from exc
    episodes = [
        Episode(
            scores=scores[so[i] : so[i + 1]],
            gold_ranks=gold[go[i] : go[i + 1]],
            n_tools=int(n_tools[i]),
            query_id=str(qids[i]),
        )
        for i in range(n_tools.size)
    ]
    return episodes, meta
