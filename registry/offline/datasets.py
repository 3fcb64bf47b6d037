"""Labelled benchmark data in the common format, and rankings of it under a scorer.

A data directory holds ``tools.json`` (any tool JSON the service accepts) and ``queries.jsonl``
with one ``{"id", "query", "gold": [names], "gold_alternatives"?: [[names]]}`` per line.

A query with several gold tools is a multi-tool task: it needs every one of them. A
``gold_alternatives`` group stands in for one gold tool (see :func:`needed_groups`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from registry.index.embed import Embedder
from registry.index.hybrid import HYBRID_ALPHA, SCORERS, Query
from registry.index.lexical import tokenize
from registry.index.snapshot import Snapshot, build_snapshot
from registry.offline.episodes import Episode
from registry.store.memory import MemoryStore
from registry.tools import Tool, ToolLimits, parse_tools


@dataclass(frozen=True, slots=True)
class LabelledQuery:
    id: str
    query: str
    gold: tuple[str, ...]
    gold_alternatives: tuple[tuple[str, ...], ...] = field(default_factory=tuple)


def needed_groups(query: LabelledQuery) -> list[tuple[str, ...]]:
    """What a multi-tool task needs: per gold tool, the tool and the tools equivalent to it.

    An alternatives group is a gold tool's equivalents when it names that tool, when the query
    has a single gold tool, or when ``gold_alternatives`` runs parallel to ``gold`` (same
    length: group ``i`` stands in for ``gold[i]``). Other groups cannot be attributed and count
    only for "any" (the flat hit set), never for "all".
    """
    alternatives = query.gold_alternatives
    parallel = len(alternatives) == len(query.gold)
    out = []
    for i, tool in enumerate(query.gold):
        members = {tool}
        for j, group in enumerate(alternatives):
            if tool in group or len(query.gold) == 1 or (parallel and i == j):
                members.update(group)
        out.append(tuple(sorted(members)))
    return out


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    tools: list[Tool]
    queries: list[LabelledQuery]


def load_dataset(directory: Path, *, queries_file: str = "queries.jsonl") -> Dataset:
    """Read ``tools.json`` and ``queries.jsonl``; queries whose gold is not in the registry are dropped."""
    directory = Path(directory)
    tools = parse_tools(json.loads((directory / "tools.json").read_text()), ToolLimits(max_tools=10**7))
    names = {tool.name for tool in tools}
    queries = []
    with open(directory / queries_file, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            row = json.loads(line)
            gold = tuple(g for g in row["gold"] if g in names)
            if not gold:
                continue
            alternatives = tuple(tuple(group) for group in row.get("gold_alternatives", []))
            queries.append(LabelledQuery(str(row["id"]), row["query"], gold, alternatives))
    return Dataset(directory.name, tools, queries)


def index_dataset(tools: Sequence[Tool], embedder: Embedder, *, hnsw_min_tools: int = 10**9) -> Snapshot:
    return build_snapshot("eval", 1, tools, embedder, MemoryStore(), hnsw_min_tools=hnsw_min_tools)


def rank_queries(
    snapshot: Snapshot,
    queries: Sequence[LabelledQuery],
    embedder: Embedder | None,
    scorer: str,
    *,
    depth: int = 60,
    alpha: float = HYBRID_ALPHA,
    batch_size: int = 64,
) -> list[Episode]:
    """Rank every query and return one Episode each: top scores and the full ranks of its gold."""
    vectors: np.ndarray | None = None
    ranker = SCORERS[scorer].tuned(alpha)
    if ranker.reads_vector:
        assert embedder is not None
        vectors = embedder.embed_documents([q.query for q in queries], batch_size=batch_size)
    n = snapshot.n_tools
    episodes = []
    for i, labelled in enumerate(queries):
        prepared = Query(  # embedded in one batch above
            vector=None if vectors is None else vectors[i],
            tokens=tokenize(labelled.query) if ranker.reads_tokens else [],
        )
        ids, scores = ranker.rank(prepared, snapshot.dense, snapshot.lexical, n)
        position = np.empty(n, dtype=np.int64)
        position[ids] = np.arange(ids.shape[0])
        gold_ranks = np.array(
            sorted(int(position[snapshot.by_name[g]]) for g in labelled.gold), dtype=np.int64
        )
        episodes.append(
            Episode(
                scores=scores[:depth].astype(np.float32),
                gold_ranks=gold_ranks,
                n_tools=n,
                query_id=labelled.id,
            )
        )
    return episodes


def dataset_episodes(
    directory: Path,
    embedder: Embedder | None,
    scorer: str,
    *,
    max_queries: int | None = None,
    seed: int = 0,
    depth: int = 60,
) -> tuple[list[Episode], dict[str, object]]:
    """Rank a data directory's queries under ``scorer``; returns episodes and provenance."""
    import hashlib
    import random

    data = load_dataset(directory)
    queries = data.queries
    if max_queries is not None and len(queries) > max_queries:
        queries = random.Random(seed).sample(queries, max_queries)
    snapshot = index_dataset(data.tools, embedder) if embedder else _lexical_only(data.tools)
    episodes = rank_queries(snapshot, queries, embedder, scorer, depth=depth)
    digest = hashlib.sha256((Path(directory) / "queries.jsonl").read_bytes()).hexdigest()
    meta: dict[str, object] = {
        "dataset": data.name,
        "path": str(directory),
        "queries_sha256": digest,
        "scorer": scorer,
        "n_tools": snapshot.n_tools,
        "n_queries": len(episodes),
        "sample_seed": seed,
        "embedder": getattr(embedder, "model_id", None),
    }
    return episodes, meta


def _lexical_only(tools: Sequence[Tool]) -> Snapshot:
    from registry.index.embed import HashingEmbedder

    return index_dataset(tools, HashingEmbedder())
