"""Sub-registries carved out of a labelled data set: MCP-server-sized registries of 5-200 tools.

A real agent often talks to a registry of 5-40 tools, and those tools are related (one MCP
server = one service's API). A policy trained only on registries of hundreds of tools has
never seen that. :func:`carve_training` / :func:`carve_grid` build, from one data set's
:class:`~registry.offline.tables.ScoreTable`, episodes over sub-registries of ``N`` tools that hold
the query's gold tools plus a fill of one of three kinds (:data:`FILL_KINDS`):

* ``random``: tools drawn uniformly from the rest of the registry (easy: the gold tool stands
  out, fixed K=1 finds nearly everything);
* ``group``: the gold tools' own group first, then whole other groups in random order, like
  a registry assembled from a few servers. Groups are RapidAPI services on StableToolBench
  (``names_map.json``, else the ``_for_<service>`` name suffix) and k-means clusters of the
  tool embeddings (about :data:`GROUP_SIZE` tools each) elsewhere;
* ``neighbours``: the tools nearest to the gold tools by tool embedding (max cosine to any
  gold tool): the hardest, every distractor is a sibling.

Queries without a gold tool in the registry make no episode; neither does a size that cannot
hold the gold tools plus one distractor or that reaches the full registry.

**Scores.** A sub-registry's hybrid score is ``cos + 0.8 * BM25_sub / ceiling_sub``
(:func:`registry.index.hybrid.fuse`) with the lexical part RECOMPUTED on the sub-corpus: BM25's
IDF, its document-length normalisation and the query's ceiling (sum of IDF) all depend on the
corpus, and a served 20-tool registry computes them over its 20 tools. Reusing the
full-registry columns would give a term that is rare in 2,479 tools but present in half of a
20-tool service its full-registry weight, i.e. score distributions no small registry produces.
It is affordable: the term frequencies of the queries' vocabulary in every tool are one small
integer matrix, and one sub-registry's BM25 is a ``(terms x N)`` gather (N <= 200). The
cosine part does not depend on the corpus and is read from the table. On the full registry the
recomputation reproduces the table's BM25 column (tested).
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from registry.index.hybrid import HYBRID_ALPHA, fuse
from registry.index.lexical import tokenize
from registry.offline.episodes import Episode

__all__ = [
    "ANCHOR_SIZES",
    "FILL_KINDS",
    "CarveSource",
    "build_source",
    "carve_grid",
    "carve_one",
    "carve_training",
    "cluster_groups",
    "load_source",
    "service_groups",
    "training_plan",
]

FILL_KINDS: tuple[str, ...] = ("random", "group", "neighbours")
ANCHOR_SIZES: tuple[int, ...] = (8, 20, 50)  # always carved (MCP-server sizes)
SIZE_RANGE: tuple[int, int] = (5, 200)  # further sizes are drawn log-uniformly from this range
GROUP_SIZE = 12  # target tools per embedding cluster (a typical MCP server)
EPISODE_DEPTH = 60  # scores kept per episode (cap 50 + feature lookahead; see rank_table)
_K1, _B = 1.5, 0.75  # BM25 (Lucene variant), as registry.index.lexical


@dataclass
class CarveSource:
    """What carving needs from one data set, beyond its score table's dense column.

    Attributes:
        name: data-set name (seeds the per-set random stream).
        dense: ``(Q, N)`` cosine of every query with every tool.
        gold: per query, the gold tools' registry indices.
        query_ids: per query.
        tf: ``(V, N)`` term frequency of the queries' vocabulary (terms present in the tool
            corpus) in each tool.
        doc_len: ``(N,)`` tokens per tool text.
        query_terms: per query, the vocabulary ids of its tokens (repeats kept, unknown terms
            dropped, as BM25 scores them).
        groups: ``(N,)`` group id of each tool.
        similarity: ``(N, N)`` cosine between tool embeddings.
    """

    name: str
    dense: np.ndarray
    gold: list[np.ndarray]
    query_ids: list[str]
    tf: np.ndarray
    doc_len: np.ndarray
    query_terms: list[np.ndarray]
    groups: np.ndarray
    similarity: np.ndarray

    @property
    def n_tools(self) -> int:
        return int(self.doc_len.size)

    def bm25(self, row: int, cand: np.ndarray) -> tuple[np.ndarray, float]:
        """BM25 scores of the tools ``cand`` for query ``row`` over the corpus ``cand`` alone,
        and the query's ceiling (sum of its terms' IDF in that corpus)."""
        terms = self.query_terms[row]
        if terms.size == 0:
            return np.zeros(cand.size, dtype=np.float64), 0.0
        tf = self.tf[np.ix_(terms, cand)].astype(np.float64)
        n = cand.size
        df = np.count_nonzero(tf, axis=1)
        idf = np.where(df > 0, np.log1p((n - df + 0.5) / (df + 0.5)), 0.0)
        dl = self.doc_len[cand]
        norm = _K1 * (1.0 - _B + _B * dl / max(float(dl.mean()), 1e-12))
        scores = (idf[:, None] * tf / (tf + norm[None, :])).sum(axis=0)
        return scores, float(idf.sum())


def service_groups(names: Sequence[str], names_map: dict[str, Any] | None = None) -> np.ndarray | None:
    """Group ids by service (``names_map[name][0]``, else the ``_for_<service>`` suffix), or
    ``None`` when fewer than 90% of the tools name a service."""
    keys: list[str | None] = []
    for name in names:
        entry = (names_map or {}).get(name)
        if isinstance(entry, list) and entry:
            keys.append(str(entry[0]))
        elif "_for_" in name:
            keys.append(name.rsplit("_for_", 1)[1])
        else:
            keys.append(None)
    if sum(k is not None for k in keys) < 0.9 * len(keys):
        return None
    filled = [k if k is not None else f"\0{i}" for i, k in enumerate(keys)]
    _, ids = np.unique(np.array(filled, dtype=object).astype(str), return_inverse=True)
    return ids.astype(np.int64)


def cluster_groups(embeddings: np.ndarray, group_size: int = GROUP_SIZE, seed: int = 0, iters: int = 25) -> np.ndarray:
    """Spherical k-means of unit tool embeddings into about ``N / group_size`` groups."""
    x = np.asarray(embeddings, dtype=np.float64)
    n = x.shape[0]
    k = max(1, min(n, round(n / group_size)))
    rng = np.random.default_rng(seed)
    centres = x[rng.choice(n, size=k, replace=False)]
    labels = np.zeros(n, dtype=np.int64)
    for _ in range(iters):
        labels = np.argmax(x @ centres.T, axis=1)
        for c in range(k):
            members = x[labels == c]
            if members.size:
                v = members.sum(axis=0)
                centres[c] = v / max(float(np.linalg.norm(v)), 1e-12)
    return labels


def _tool_embeddings(texts: list[str], embedder: Any, cache_dir: Path | None, name: str) -> np.ndarray:
    key = hashlib.sha256(
        ("\0".join(texts) + "\0" + str(getattr(embedder, "model_id", None))).encode()
    ).hexdigest()[:16]
    path = None if cache_dir is None else Path(cache_dir) / f"{name}-tools-{key}.npy"
    if path is not None and path.is_file():
        return np.load(path, allow_pickle=False)
    vecs = np.asarray(embedder.embed_documents(texts), dtype=np.float32)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, vecs)
        tmp.replace(path)
    return vecs


def build_source(
    table: Any, tool_texts: Sequence[str], query_texts: Sequence[str], embeddings: np.ndarray,
    *, names_map: dict[str, Any] | None = None, seed: int = 0,
) -> CarveSource:
    """A :class:`CarveSource` from a table, the tools' texts, the queries' texts (table order)
    and the unit tool embeddings."""
    if table.dense is None:
        raise ValueError("carving needs a table with dense scores (build it with an embedder)")
    corpus = [tokenize(t) for t in tool_texts]
    known = set().union(*map(set, corpus)) if corpus else set()
    q_tokens = [[w for w in tokenize(q) if w in known] for q in query_texts]
    vocab = {w: i for i, w in enumerate(sorted({w for toks in q_tokens for w in toks}))}
    tf = np.zeros((len(vocab), len(corpus)), dtype=np.uint16)
    for j, toks in enumerate(corpus):
        for w, c in Counter(toks).items():
            v = vocab.get(w)
            if v is not None:
                tf[v, j] = min(c, 65535)
    emb = np.asarray(embeddings, dtype=np.float32)
    groups = service_groups(table.tool_names, names_map)
    if groups is None:
        groups = cluster_groups(emb, seed=seed)
    return CarveSource(
        name=table.name,
        dense=table.dense,
        gold=list(table.gold),
        query_ids=list(table.query_ids),
        tf=tf,
        doc_len=np.array([len(t) for t in corpus], dtype=np.float64),
        query_terms=[np.array([vocab[w] for w in toks], dtype=np.int64) for toks in q_tokens],
        groups=groups,
        similarity=emb @ emb.T,
    )


def load_source(table: Any, embedder: Any, *, cache_dir: Path | None = None, seed: int = 0) -> CarveSource:
    """:func:`build_source` for a table built from a data directory (``table.meta["path"]``);
    tool embeddings cached in ``cache_dir``."""
    from registry.offline.datasets import load_dataset

    directory = Path(table.meta["path"])
    data = load_dataset(directory)
    by_id = {q.id: q.query for q in data.queries}
    texts = [t.text() for t in data.tools]
    if [t.name for t in data.tools] != list(table.tool_names):
        raise ValueError(f"{directory}: tools differ from the score table's")
    names_map = None
    if (directory / "names_map.json").is_file():
        names_map = json.loads((directory / "names_map.json").read_text(encoding="utf-8"))
    emb = _tool_embeddings(texts, embedder, cache_dir, table.name)
    return build_source(
        table, texts, [by_id[q] for q in table.query_ids], emb, names_map=names_map, seed=seed
    )


def _fill(src: CarveSource, gold: np.ndarray, n_fill: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    mask = np.ones(src.n_tools, dtype=bool)
    mask[gold] = False
    if kind == "random":
        return rng.choice(np.flatnonzero(mask), size=n_fill, replace=False)
    if kind == "neighbours":
        sim = src.similarity[gold].max(axis=0)
        rest = np.flatnonzero(mask)
        order = np.lexsort((rest, -sim[rest]))
        return rest[order[:n_fill]]
    if kind == "group":
        own = np.isin(src.groups, src.groups[gold]) & mask
        same = rng.permutation(np.flatnonzero(own))
        if same.size >= n_fill:
            return same[:n_fill]
        others = np.unique(src.groups[mask & ~own])
        order = rng.permutation(others)
        rank = np.full(int(src.groups.max()) + 1, np.iinfo(np.int64).max)
        rank[order] = np.arange(order.size)
        rest = np.flatnonzero(mask & ~own)
        rest = rest[np.lexsort((rng.random(rest.size), rank[src.groups[rest]]))]
        return np.concatenate([same, rest[: n_fill - same.size]])
    raise ValueError(f"unknown fill kind {kind!r}; choose one of {FILL_KINDS}")


def carve_one(
    src: CarveSource, row: int, n: int, kind: str, rng: np.random.Generator, *, alpha: float = HYBRID_ALPHA
) -> Episode | None:
    """The episode of query ``row`` over a sub-registry of ``n`` tools (gold + ``kind`` fill),
    or ``None`` when the query has no gold tool or ``n`` does not fit (see the module doc)."""
    gold = src.gold[row]
    if gold.size == 0 or n <= gold.size or n >= src.n_tools:
        return None
    cand = np.concatenate([gold, _fill(src, gold, n - gold.size, kind, rng)]).astype(np.int64)
    lexical, ceiling = src.bm25(row, cand)
    scores = fuse(src.dense[row, cand].astype(np.float64), lexical, float(ceiling), alpha)
    order = np.lexsort((cand, -scores))  # ties by registry index, never by position in cand
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    return Episode(
        scores=scores[order[:EPISODE_DEPTH]],
        gold_ranks=np.sort(position[: gold.size]),
        n_tools=n,
        query_id=f"{src.query_ids[row]}@{kind}{n}",
    )


def _rng(src: CarveSource, seed: int, *extra: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(src.name.encode()), *extra])


def carve_grid(
    src: CarveSource, rows: Sequence[int], sizes: Sequence[int], kinds: Sequence[str] = FILL_KINDS, *, seed: int = 0
) -> dict[tuple[int, str], list[Episode]]:
    """Every query of ``rows`` carved at every size and fill kind: ``{(n, kind): episodes}``."""
    out: dict[tuple[int, str], list[Episode]] = {}
    for n in sizes:
        for kind in kinds:
            rng = _rng(src, seed, int(n), FILL_KINDS.index(kind))
            eps = [carve_one(src, int(r), int(n), kind, rng) for r in rows]
            out[(int(n), kind)] = [e for e in eps if e is not None]
    return out


def training_plan(
    n_rows: int, per_query: int, rng: np.random.Generator,
    anchors: Sequence[int] = ANCHOR_SIZES, size_range: tuple[int, int] = SIZE_RANGE,
) -> tuple[np.ndarray, np.ndarray]:
    """``(sizes, kinds)`` of shape ``(n_rows, per_query)``: carve ``j`` of every query has size
    ``anchors[j]`` (then log-uniform in ``size_range``); fill kinds rotate over queries and carves."""
    lo, hi = math.log(size_range[0]), math.log(size_range[1])
    sizes = np.rint(np.exp(rng.uniform(lo, hi, size=(n_rows, per_query)))).astype(np.int64)
    m = min(per_query, len(anchors))
    sizes[:, :m] = np.asarray(anchors[:m], dtype=np.int64)[None, :]
    kinds = (np.arange(n_rows)[:, None] + np.arange(per_query)[None, :]) % len(FILL_KINDS)
    return sizes, kinds


def carve_training(
    src: CarveSource, rows: Sequence[int], per_query: int, *, seed: int = 0,
    anchors: Sequence[int] = ANCHOR_SIZES, size_range: tuple[int, int] = SIZE_RANGE,
) -> list[Episode]:
    """``per_query`` carved episodes per query of ``rows`` (see :func:`training_plan`)."""
    if per_query <= 0 or not rows:
        return []
    rng = _rng(src, seed)
    sizes, kinds = training_plan(len(rows), per_query, rng, anchors, size_range)
    out = []
    for i, r in enumerate(rows):
        for j in range(per_query):
            ep = carve_one(src, int(r), int(sizes[i, j]), FILL_KINDS[kinds[i, j]], rng)
            if ep is not None:
                out.append(ep)
    return out
