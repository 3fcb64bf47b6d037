"""Immutable registry snapshots: tools, embeddings, FAISS and BM25 indexes of one version."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from registry.feedback import EquivalenceClasses
from registry.index.dense import DenseIndex
from registry.index.embed import Embedder
from registry.index.graph import ToolGraph
from registry.index.graph_edits import NO_EDITS, EdgeEdits
from registry.index.lexical import LexicalIndex
from registry.index.named_tools import NameIndex
from registry.runtime import trim_heap
from registry.store.base import Store
from registry.tools import Tool

log = logging.getLogger(__name__)

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
    written_at: float | None = None  # Unix time this version was written to the store
    embedder: str = ""  # model_id of the embedder every vector of this version came from
    graph: ToolGraph = field(default_factory=ToolGraph)  # prerequisites, read at upload

    @property
    def n_tools(self) -> int:
        return len(self.tools)

    @property
    def edits(self) -> EdgeEdits:
        """The admin's edits of the read graph (kept with the version)."""
        return self.graph.edits

    def definitions(self) -> list[dict[str, Any]]:
        return [tool.definition for tool in self.tools]


# Texts embedded per call when many are missing: each batch's vectors are written to the store
# before the next starts, so a large upload holds one batch of model activations at a time and
# an interrupted one resumes from the cache.
EMBED_BATCH = 256


# Tokens per model batch (texts x their length): 2 texts of MiniLM's 256-token maximum, 16
# short ones (measured on 96 texts of 2,400 characters, two embedding workers: peak RSS +860 MB
# at 32 a batch, +160 MB at 4, and no slower; a 5,000-tool upload at 4 peaked at 605 MB).
MODEL_BATCH_TOKENS = 512


def _model_batch(longest: str) -> int:
    tokens = min(256, len(longest) // 4 + 2)  # ~4 characters a token, capped at MiniLM's maximum
    return max(1, min(32, MODEL_BATCH_TOKENS // tokens))


UNIT_TOLERANCE = 1e-2  # float32 rounding of a unit vector stays far inside this


def sound_vectors(found: dict[str, np.ndarray], embedder: Embedder) -> dict[str, np.ndarray]:
    """The cached vectors fit to serve: of the embedder's size, finite, of unit length (every
    embedder here L2-normalises) or zero. The cache is a file anyone with disk access can
    damage; a bad record (NaN, 1e30) would otherwise be served and reused by content hash
    forever. The rest are logged and left out, so the caller embeds them again and stores the
    fresh vectors over them. Checked where a version is built, never per query."""
    if not found:
        return found
    keys = list(found)
    rows = [np.asarray(found[k]) for k in keys]
    sized = [r.shape == (embedder.dim,) for r in rows]
    good: dict[str, np.ndarray] = {}
    if any(sized):
        matrix = np.stack([r for r, ok in zip(rows, sized) if ok]).astype(np.float32, copy=False)
        with np.errstate(all="ignore"):
            norms = np.linalg.norm(matrix.astype(np.float64), axis=1)
        fine = np.isfinite(matrix).all(axis=1) & ((np.abs(norms - 1.0) <= UNIT_TOLERANCE) | (norms == 0.0))
        sized_keys = [k for k, ok in zip(keys, sized) if ok]
        good = {k: found[k] for k, ok in zip(sized_keys, fine) if ok}
    bad = len(found) - len(good)
    if bad:
        log.warning(
            "embedding cache of %s: %d cached vectors are damaged (wrong size, non-finite or not "
            "unit length); embedding them again", embedder.model_id, bad,
        )
    return good


def embed_tools(
    tools: Sequence[Tool],
    embedder: Embedder,
    store: Store,
    *,
    hashes: Sequence[str] | None = None,
    known: dict[str, np.ndarray] | None = None,
    batch: int = EMBED_BATCH,
) -> np.ndarray:
    """Embeddings of ``tools`` in order, reusing the store's cache keyed by content hash.

    ``hashes`` are the tools' content hashes when the caller has them; ``known`` maps hashes
    to vectors already at hand, which skips the cache for them. Missing texts are embedded
    ``batch`` at a time, each batch stored before the next.
    """
    if hashes is None:
        hashes = [tool.content_hash() for tool in tools]
    cached = dict(known or {})
    wanted = [h for h in dict.fromkeys(hashes) if h not in cached]
    if wanted:
        cached.update(sound_vectors(store.get_embeddings(embedder.model_id, wanted), embedder))
    missing: dict[str, Tool] = {}
    for tool, content_hash in zip(tools, hashes):
        if content_hash not in cached and content_hash not in missing:
            missing[content_hash] = tool
    # Similar lengths share a call, and long texts go fewer to a model batch: the activations
    # grow with batch x tokens (32 texts of 256 tokens on two workers peaked at ~1.1 GB RSS).
    pending = sorted(missing.items(), key=lambda item: len(item[1].text()))
    for start in range(0, len(pending), batch):
        chunk = pending[start : start + batch]
        texts = [tool.text() for _, tool in chunk]
        vectors = embedder.embed_documents(texts, batch_size=_model_batch(texts[-1]))
        fresh = {content_hash: vectors[i] for i, (content_hash, _) in enumerate(chunk)}
        store.put_embeddings(embedder.model_id, fresh)
        cached.update(fresh)
        if len(pending) > batch:
            trim_heap()  # hand each chunk's freed activations back before the next
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
    edits: EdgeEdits = NO_EDITS,
) -> Snapshot:
    """Embed (through the cache) and index ``tools`` into a servable snapshot.

    With ``previous`` (the version being replaced) the snapshot is derived from it: tools whose
    text is unchanged keep their vectors and BM25 term counts, only new texts are embedded and
    tokenised, BM25 postings are extended (:meth:`LexicalIndex.updated`), a flat FAISS index is
    refilled from the copied matrix and a large HNSW index clones the previous graph and adds
    the new vectors (:meth:`DenseIndex.updated`). ``previous`` itself is never modified
    (readers may still be using it). A one-tool change costs milliseconds, not a rebuild.
    The prerequisite graph (:class:`~registry.index.graph.ToolGraph`) is read from the tools
    (facts of unchanged texts reused) with the admin's ``edits`` on top.
    """
    hashes = [tool.content_hash() for tool in tools]
    graph = ToolGraph.build(
        tools, hashes, edits=edits, previous=previous.graph if previous is not None else None
    )
    groups = tuple(tuple(group) for group in equivalents)
    if previous is not None and previous.embedder != embedder.model_id:
        previous = None  # another embedder's vectors: never mixed, everything is re-embedded
    if previous is None or len(previous.content_hashes) != previous.n_tools:
        embeddings = embed_tools(tools, embedder, store, hashes=hashes)
        dense = DenseIndex(embeddings, hnsw_min_tools=hnsw_min_tools)
        lexical = LexicalIndex([tool.text() for tool in tools])
    else:
        position = {h: i for i, h in enumerate(previous.content_hashes)}
        reuse = np.fromiter((position.get(h, -1) for h in hashes), np.int64, len(hashes))
        kept = reuse >= 0
        new_rows = np.flatnonzero(~kept)
        embeddings = np.empty((len(tools), embedder.dim), dtype=np.float32)
        embeddings[kept] = previous.dense.embeddings[reuse[kept]]
        if new_rows.size:
            embeddings[new_rows] = embed_tools(
                [tools[i] for i in new_rows.tolist()],
                embedder,
                store,
                hashes=[hashes[i] for i in new_rows.tolist()],
            )
        dense = DenseIndex.updated(previous.dense, embeddings, reuse, hnsw_min_tools=hnsw_min_tools)
        texts = [tool.text() for tool in tools]
        lexical = LexicalIndex.updated(previous.lexical, texts, reuse)
    names = [tool.name for tool in tools]
    by_name: dict[str, int] = {name: i for i, name in enumerate(names)}
    name_index: NameIndex | None = None
    equivalence: EquivalenceClasses | None = None
    if previous is not None:  # unchanged parts are shared (they are never mutated)
        before = list(previous.by_name)
        if before == names:
            by_name, name_index = previous.by_name, previous.names
        elif len(names) > len(before) and names[: len(before)] == before:  # tools appended
            name_index = previous.names.extended(names[len(before) :], len(before))
        if previous.equivalents == groups:
            equivalence = previous.equivalence
    return Snapshot(
        registry=registry,
        version=version,
        tools=tuple(tools),
        by_name=by_name,
        dense=dense,
        lexical=lexical,
        equivalents=groups,
        equivalence=equivalence if equivalence is not None else EquivalenceClasses(groups),
        content_hashes=tuple(hashes),
        names=name_index if name_index is not None else NameIndex(names),
        embedder=embedder.model_id,
        graph=graph,
    )
