"""A logged request ranked again as the registry would serve it now (for depth refits).

A refit that fits a stop rule on the scores logged when each request was served fits the
ranking of the past: before the usage memory grew and before the refit shipped a new profile
weight, so its rule stops on score shapes the registry no longer serves, and the used tools
that agents found elsewhere sit at the ranks they had then (often past the deepest list a rule
may show: no candidate can find them). :func:`replay_ranking` recomputes, for one logged
request text, the ranking the query path would serve now (base scorer, usage memory and usage
profiles applied), the depth policy's margins and feature rows on it, and the names in order.

The memory's recall of the request's *own repeats* is left out (entries at or above the
memory's dedupe cosine): the event being replayed is itself in the memory, and a rule fitted
on rankings that recall their own feedback would stop at 1 on requests that are new.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from registry.index.embed import Embedder
from registry.index.hybrid import SCORERS, Query, Scorer, prepare, rank_windows
from registry.index.snapshot import Snapshot
from registry.serving.chains import Companions
from registry.serving.depth_policies import TunableDepthPolicy
from registry.serving.features import FEATURE_WINDOW, depth_features
from registry.serving.needs import needs_features, request_signals
from registry.serving.shorthand import expand_shorthand
from registry.serving.windows import query_windows

__all__ = ["ReplayedRanking", "UsageRerank", "base_ranking", "feature_rows", "policy_schema", "replay_ranking"]


class UsageRerank(Protocol):
    """Lifts a ranking by what agents used for similar queries (the learning loop's usage
    memory and profiles); ``exclude_repeats`` leaves out the recall of the request's own
    repeats (a replay)."""

    def rerank(
        self, snap: Snapshot, query: np.ndarray, ids: np.ndarray, scores: np.ndarray,
        *, exclude_repeats: bool = False, with_profiles: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def companions(self, snap: Snapshot) -> Companions | None:
        """The registry's learned companions by ``snap``'s positions (None: none, or learning
        is off for it)."""


@dataclass(frozen=True, slots=True)
class ReplayedRanking:
    """One request ranked now: the policy's margins and feature rows per depth ``1..D``, the
    ranking's tool names (at least ``FEATURE_WINDOW`` when the registry has them) and its
    feature schema (``"1"`` score features, ``"2"`` plus the request's needs)."""

    margins: np.ndarray  # (D,)
    features: np.ndarray  # (D, F)
    ranking: tuple[str, ...]
    schema: str


def policy_schema(policy: TunableDepthPolicy) -> str:
    """The feature schema ``policy`` reads: ``"2"`` with a needs model, else ``"1"``."""
    return "1" if policy.needs_model is None else "2"


def feature_rows(
    policy: TunableDepthPolicy, scores: np.ndarray, n_tools: int, depth: int, signals: np.ndarray | None
) -> np.ndarray:
    """The feature rows a calibrated stop rule reads under ``policy`` (its schema: the score
    features, plus the request's needs for a schema-2 policy), depths ``1..depth``."""
    model = policy.needs_model
    if model is None:
        return depth_features(scores, n_tools, depth)
    return needs_features(scores, n_tools, depth, signals, model)


def query_windows_for(text: str, scorer: Scorer, embedder: Embedder) -> list[Query]:
    """``text`` (its shorthand spelled out) as one prepared query per window, as ``scorer``
    reads it: the query path and a replay prepare a request the same way."""
    return [prepare(scorer, w, embedder.embed_query) for w in query_windows(expand_shorthand(text))]


def base_ranking(
    snap: Snapshot, text: str, depth: int, *, scorer: str, embedder: Embedder, usage: UsageRerank | None
) -> tuple[tuple[str, ...], np.ndarray]:
    """``text``'s ranking on ``snap`` before the usage profiles (base scorer and the usage
    memory without the request's own repeats): what a profile-weight fit lifts, as a new
    phrasing would meet it (the logged ranking recalled the request's earlier feedback)."""
    ranker = SCORERS[scorer]
    windows = query_windows_for(text, ranker, embedder)
    ids, scores = rank_windows(ranker, windows, snap.dense, snap.lexical, min(depth, snap.n_tools))
    if usage is not None and windows[0].vector is not None and len(ids):
        ids, scores = usage.rerank(snap, windows[0].vector, ids, scores, exclude_repeats=True, with_profiles=False)
    return tuple(snap.tools[int(t)].name for t in ids), np.asarray(scores, np.float32)


def replay_ranking(
    snap: Snapshot,
    text: str,
    depth: int,
    *,
    scorer: str,
    embedder: Embedder,
    policy: TunableDepthPolicy,
    usage: UsageRerank | None,
) -> ReplayedRanking | None:
    """``text`` ranked on ``snap`` as served now, with ``depth`` policy states (the logged
    request's cap); None when nothing can be ranked."""
    n = snap.n_tools
    if n == 0 or depth < 1 or not text.strip():
        return None
    ranker = SCORERS[scorer]
    windows = query_windows_for(text, ranker, embedder)
    ids, scores = rank_windows(ranker, windows, snap.dense, snap.lexical, min(max(depth, FEATURE_WINDOW), n))
    if usage is not None and windows[0].vector is not None:
        ids, scores = usage.rerank(snap, windows[0].vector, ids, scores, exclude_repeats=True)
    if len(ids) == 0:
        return None
    schema = policy_schema(policy)
    signals = request_signals(text) if schema == "2" else None
    q = np.asarray(policy.q_values(scores, n, depth, signals))
    if q.shape[0] == 0:
        return None
    return ReplayedRanking(
        margins=(q[:, 0] - q[:, 1]).astype(np.float64),
        features=np.asarray(feature_rows(policy, np.asarray(scores), n, q.shape[0], signals), np.float64),
        ranking=tuple(snap.tools[int(t)].name for t in ids),
        schema=schema,
    )
