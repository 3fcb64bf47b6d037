"""Immutable registry snapshots: tools, embeddings, FAISS and BM25 indexes of one version."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from registry.feedback import EquivalenceClasses
from registry.index.dense import DenseIndex
from registry.index.embed import Embedder
from registry.index.lexical import LexicalIndex
from registry.query import NameIndex
from registry.store.base import Store
from registry.tools import Tool


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One registry version, ready to serve. Never mutated: updates build a new snapshot."""

    registry: str
    version: int
    tools: tuple[Tool, ...]
    by_name: dict[str, int]
    dense: DenseIndex
    lexical: LexicalIndex
    equivalents: tuple[tuple[str, ...], ...] = field(default_factory=tuple)
    equivalence: EquivalenceClasses = field(default_factory=EquivalenceClasses)
    content_hashes: tuple[str, ...] = ()  # per tool, the embedding cache key of its text
    names: NameIndex = field(default_factory=lambda: NameIndex(()))  # names a request may quote
    embedder: str = ""  # model_id of the embedder every vector of this version came from

    @property
    def n_tools(self) -> int:
        return len(self.tools)

    def definitions(self) -> list[dict[str, Any]]:
        return [tool.definition for tool in self.tools]


def embed_tools(
    tools: Sequence[Tool],
    embedder: Embedder,
    store: Store,
    *,
    hashes: Sequence[str] | None = None,
    known: dict[str, np.ndarray] | None = None,
) -> np.ndarray:
    """Embeddings of ``tools`` in order, reusing the store's cache keyed by content hash.

    ``hashes`` are the tools' content hashes when the caller has them; ``known`` maps hashes
    to vectors already at hand (the previous version's), which skips the cache for them.
    """
    if hashes is None:
        hashes = [tool.content_hash() for tool in tools]
    cached = dict(known or {})
    wanted = [h for h in dict.fromkeys(hashes) if h not in cached]
    if wanted:
        cached.update(store.get_embeddings(embedder.model_id, wanted))
    missing: dict[str, str] = {}
    for tool, content_hash in zip(tools, hashes):
        if content_hash not in cached and content_hash not in missing:
            missing[content_hash] = tool.text()
    if missing:
        vectors = embedder.embed_documents(list(missing.values()))
        fresh = dict(zip(missing.keys(), vectors))
        store.put_embeddings(embedder.model_id, fresh)
        cached.update(fresh)
    matrix = np.empty((len(tools), embedder.dim), dtype=np.float32)
    for row, content_hash in enumerate(hashes):
        matrix[row] = cached[content_hash]
    return matrix


def build_snapshot(
    registry: str,
    version: int,
    tools: Sequence[Tool],
    embedder: Embedder,
    store: Store,
    *,
    hnsw_min_tools: int,
    equivalents: Sequence[Sequence[str]] = (),
    previous: Snapshot | None = None,
) -> Snapshot:
    """Embed (through the cache) and index ``tools`` into a servable snapshot.

    With ``previous`` (the version being replaced) the vectors of unchanged tools are taken
    from it and a large HNSW index is derived from its graph (:meth:`DenseIndex.updated`)
    instead of being rebuilt: a one-tool change to a 100,000-tool registry then skips the
    graph construction.
    """
    hashes = [tool.content_hash() for tool in tools]
    position: dict[str, int] = {}
    known: dict[str, np.ndarray] = {}
    if previous is not None and previous.embedder != embedder.model_id:
        previous = None  # another embedder's vectors: never mixed, everything is re-embedded
    if previous is not None and len(previous.content_hashes) == previous.n_tools:
        position = {h: i for i, h in enumerate(previous.content_hashes)}
        known = {h: previous.dense.embeddings[i] for h, i in position.items()}
    embeddings = embed_tools(tools, embedder, store, hashes=hashes, known=known)
    if previous is not None and position:
        reuse = np.array([position.get(h, -1) for h in hashes], dtype=np.int64)
        dense = DenseIndex.updated(previous.dense, embeddings, reuse, hnsw_min_tools=hnsw_min_tools)
    else:
        dense = DenseIndex(embeddings, hnsw_min_tools=hnsw_min_tools)
    return Snapshot(
        registry=registry,
        version=version,
        tools=tuple(tools),
        by_name={tool.name: i for i, tool in enumerate(tools)},
        dense=dense,
        lexical=LexicalIndex([tool.text() for tool in tools]),
        equivalents=tuple(tuple(group) for group in equivalents),
        equivalence=EquivalenceClasses(equivalents),
        content_hashes=tuple(hashes),
        names=NameIndex(tool.name for tool in tools),
        embedder=embedder.model_id,
    )
