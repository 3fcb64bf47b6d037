"""FAISS dense index: exact and HNSW search, and HNSW indexes derived from the previous version
(clone + add + masked slots) against indexes rebuilt from scratch."""

from __future__ import annotations

import numpy as np
import pytest

from registry.index.dense import MAX_DEAD_FRACTION, DenseIndex

DIM = 32


def unit(rows: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact_top(emb: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(emb @ q), kind="stable")[:k]


@pytest.mark.parametrize("min_tools, kind", [(10**6, "flat"), (100, "hnsw")])
def test_search_finds_the_nearest_tools(min_tools: int, kind: str) -> None:
    emb = unit(2000, 0)
    index = DenseIndex(emb, hnsw_min_tools=min_tools)
    assert index.kind == kind and len(index) == 2000 and index.dead_slots == 0
    queries = unit(100, 1)
    overlap = []
    for q in queries:
        ids, scores = index.search(q, 10)
        np.testing.assert_allclose(scores, emb[ids] @ q, atol=1e-5)
        assert list(scores) == sorted(scores, reverse=True)
        overlap.append(len(set(ids) & set(exact_top(emb, q, 10))) / 10)
    assert np.mean(overlap) >= (1.0 if kind == "flat" else 0.95)
    ids, _ = index.search(emb[7], 1)
    assert ids[0] == 7
    assert index.search(queries[0], 0)[0].size == 0


def new_version(old: np.ndarray, seed: int, removed: int, changed: int, added: int):
    """The next version's embeddings (shuffled positions) and, per new tool, its old position
    when its vector is unchanged (else -1)."""
    rng = np.random.default_rng(seed)
    keep = rng.permutation(old.shape[0])[removed:]
    changed_rows = keep[:changed]
    rows, reuse = [], []
    for p in keep:
        if p in set(changed_rows):
            rows.append(unit(1, int(rng.integers(1 << 30)))[0])
            reuse.append(-1)
        else:
            rows.append(old[p])
            reuse.append(int(p))
    for v in unit(added, seed + 1):
        rows.append(v)
        reuse.append(-1)
    order = rng.permutation(len(rows))
    return np.stack(rows)[order], np.array(reuse)[order]


def test_an_updated_hnsw_index_searches_like_a_rebuilt_one() -> None:
    old = unit(3000, 2)
    previous = DenseIndex(old, hnsw_min_tools=1000)
    emb, reuse = new_version(old, 3, removed=100, changed=50, added=200)
    updated = DenseIndex.updated(previous, emb, reuse, hnsw_min_tools=1000)
    assert updated.kind == "hnsw" and len(updated) == emb.shape[0] == 3100
    assert updated.dead_slots == 150  # removed + changed: masked, never returned
    assert len(previous) == 3000 and previous.dead_slots == 0  # the old version is untouched
    rebuilt = DenseIndex(emb, hnsw_min_tools=1000)
    overlap_updated, overlap_rebuilt = [], []
    for q in unit(200, 4):
        ids, scores = updated.search(q, 10)
        assert ids.size == 10 and ids.max() < emb.shape[0]
        np.testing.assert_allclose(scores, emb[ids] @ q, atol=1e-5)  # the new rows, not dead ones
        truth = set(exact_top(emb, q, 10))
        overlap_updated.append(len(set(ids) & truth) / 10)
        overlap_rebuilt.append(len(set(rebuilt.search(q, 10)[0]) & truth) / 10)
    assert np.mean(overlap_updated) >= np.mean(overlap_rebuilt) - 0.02
    assert np.mean(overlap_updated) >= 0.95
    for row in np.flatnonzero(reuse < 0)[:20]:  # every new or changed tool is findable
        assert updated.search(emb[row], 1)[0][0] == row
    again = DenseIndex.updated(updated, emb, np.arange(emb.shape[0]), hnsw_min_tools=1000)
    assert again.dead_slots == 150 and again.search(emb[5], 1)[0][0] == 5  # chains of updates


def test_two_new_tools_with_one_old_vector_are_both_found() -> None:
    old = unit(1500, 5)
    previous = DenseIndex(old, hnsw_min_tools=1000)
    emb = np.concatenate([old, old[:1]])  # a copy of tool 0 under another name
    reuse = np.concatenate([np.arange(1500), [0]])
    updated = DenseIndex.updated(previous, emb, reuse, hnsw_min_tools=1000)
    ids, scores = updated.search(old[0], 2)
    assert set(ids) == {0, 1500} and np.allclose(scores, 1.0, atol=1e-5)


def test_rebuilds_when_too_much_is_dead_or_the_kind_changes() -> None:
    old = unit(2000, 6)
    previous = DenseIndex(old, hnsw_min_tools=1000)
    cut = int(2000 * (MAX_DEAD_FRACTION + 0.05))
    emb = old[cut:]
    rebuilt = DenseIndex.updated(previous, emb, np.arange(cut, 2000), hnsw_min_tools=1000)
    assert rebuilt.kind == "hnsw" and rebuilt.dead_slots == 0
    assert rebuilt._index is not None and rebuilt._index.ntotal == emb.shape[0]
    small = DenseIndex.updated(previous, old[:500], np.arange(500), hnsw_min_tools=1000)
    assert small.kind == "flat"
    flat_prev = DenseIndex(old[:900], hnsw_min_tools=1000)
    grown = DenseIndex.updated(flat_prev, old, np.r_[np.arange(900), -np.ones(1100, int)], hnsw_min_tools=1000)
    assert grown.kind == "hnsw" and grown.dead_slots == 0
    with pytest.raises(ValueError):
        DenseIndex.updated(previous, old, np.full(2000, 5000), hnsw_min_tools=1000)
