"""Sub-registry carving (registry/offline/carve.py) on a tiny synthetic score table."""

from __future__ import annotations

import numpy as np
import pytest

from registry.index.lexical import LexicalIndex, tokenize
from registry.offline.carve import (
    FILL_KINDS,
    build_source,
    carve_grid,
    carve_one,
    carve_training,
    cluster_groups,
    service_groups,
    training_plan,
)
from registry.offline.evaluate import ScoreTable

SERVICES = ["weather", "stocks", "mail", "calendar", "maps", "music", "news", "files"]
N_TOOLS = 8 * 8  # 8 services x 8 tools


def _tools() -> tuple[list[str], list[str]]:
    names, texts = [], []
    for s in SERVICES:
        for j in range(8):
            names.append(f"op{j}_for_{s}")
            texts.append(f"{s} operation {j} " + " ".join([s] * (j % 3)) + (" lookup data" if j % 2 else ""))
    return names, texts


@pytest.fixture(scope="module")
def source():
    names, texts = _tools()
    queries = ["weather operation 3 lookup", "stocks data", "send mail 5", "nothing relevant here"]
    gold = [[3], [8 + 1], [16 + 5, 16 + 6], []]
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(len(SERVICES), 16))
    emb = np.repeat(centres, 8, axis=0) + 0.3 * rng.normal(size=(N_TOOLS, 16))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    lex = LexicalIndex(texts)
    toks = [tokenize(q) for q in queries]
    table = ScoreTable(
        name="synthetic",
        tool_names=names,
        query_ids=[f"q{i}" for i in range(len(queries))],
        dense=rng.uniform(0.0, 0.5, size=(len(queries), N_TOOLS)).astype(np.float32),
        lexical=np.stack([lex.scores(t) for t in toks]),
        ceiling=np.array([lex.ceiling(t) for t in toks]),
        gold=[np.array(g, dtype=np.int64) for g in gold],
        hits=[np.array(g, dtype=np.int64) for g in gold],
    )
    return table, texts, queries, build_source(table, texts, queries, emb)


def test_bm25_is_recomputed_on_the_sub_corpus(source) -> None:
    table, texts, queries, src = source
    everything = np.arange(N_TOOLS)
    for row in range(len(queries)):
        scores, ceiling = src.bm25(row, everything)  # the full registry: the table's columns
        np.testing.assert_allclose(scores, table.lexical[row], rtol=1e-5, atol=1e-6)
        assert ceiling == pytest.approx(table.ceiling[row])
    sub = np.array([3, 5, 11, 40, 41, 60])
    sub_index = LexicalIndex([texts[i] for i in sub])  # what a served 6-tool registry computes
    for row, q in enumerate(queries):
        scores, ceiling = src.bm25(row, sub)
        np.testing.assert_allclose(scores, sub_index.scores(tokenize(q)), rtol=1e-5, atol=1e-6)
        assert ceiling == pytest.approx(sub_index.ceiling(tokenize(q)))
        assert not np.allclose(scores, table.lexical[row][sub]) or not scores.any()


def test_groups_by_service_suffix_else_by_clusters(source) -> None:
    _, _, _, src = source
    np.testing.assert_array_equal(np.bincount(src.groups), [8] * 8)
    assert (np.diff(src.groups.reshape(8, 8), axis=1) == 0).all()
    assert service_groups(["alpha", "beta", "gamma_for_x"]) is None
    emb = np.repeat(np.eye(4), 12, axis=0) + 0.01
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    labels = cluster_groups(emb, group_size=12)
    assert len(set(labels.tolist())) == 4 and all(len(set(labels[i * 12 : i * 12 + 12])) == 1 for i in range(4))


@pytest.mark.parametrize("kind", FILL_KINDS)
def test_carved_episode_holds_the_gold_and_ranks_it_right(source, kind: str) -> None:
    from registry.offline.carve import _fill

    table, _, _, src = source
    ep = carve_one(src, 2, 12, kind, np.random.default_rng(1))
    assert ep is not None and ep.n_tools == 12 and ep.n_gold == 2 and ep.scores.size == 12
    assert ep.query_id == f"q2@{kind}12"
    # the same draw by hand: hybrid = cos + 0.8 * BM25 / ceiling over the 12-tool corpus
    gold = table.gold[2]
    cand = np.concatenate([gold, _fill(src, gold, 10, kind, np.random.default_rng(1))])
    lexical, ceiling = src.bm25(2, cand)
    hybrid = (table.dense[2, cand] + 0.8 * lexical / ceiling).astype(np.float32)
    np.testing.assert_allclose(ep.scores, np.sort(hybrid)[::-1], rtol=1e-6)
    np.testing.assert_allclose(np.sort(ep.scores[ep.gold_ranks]), np.sort(hybrid[:2]), rtol=1e-6)


def test_fill_kinds(source) -> None:
    _, _, _, src = source
    rng = np.random.default_rng(0)
    from registry.offline.carve import _fill

    gold = np.array([3])
    group = _fill(src, gold, 10, "group", rng)
    assert len(set(group.tolist())) == 10 and 3 not in group
    assert set(group[:7].tolist()) == {0, 1, 2, 4, 5, 6, 7}  # the own service first
    assert len({int(src.groups[t]) for t in group[7:]}) == 1  # then one whole other service
    near = _fill(src, gold, 5, "neighbours", rng)
    sim = src.similarity[3].copy()
    sim[3] = -np.inf
    np.testing.assert_array_equal(np.sort(near), np.sort(np.argsort(-sim)[:5]))
    rand = _fill(src, gold, 20, "random", rng)
    assert len(set(rand.tolist())) == 20 and 3 not in rand
    with pytest.raises(ValueError):
        _fill(src, gold, 3, "nope", rng)


def test_queries_without_gold_or_sizes_that_do_not_fit_make_no_episode(source) -> None:
    _, _, _, src = source
    rng = np.random.default_rng(0)
    assert carve_one(src, 3, 8, "random", rng) is None  # no gold
    assert carve_one(src, 2, 2, "random", rng) is None  # 2 gold tools, no room for a distractor
    assert carve_one(src, 0, N_TOOLS, "random", rng) is None  # the full registry is not a carve
    grid = carve_grid(src, [0, 1, 2, 3], [5, 20], seed=0)
    assert set(grid) == {(n, k) for n in (5, 20) for k in FILL_KINDS}
    assert all(len(v) == 3 for v in grid.values())


def test_training_plan_always_has_the_anchor_sizes_and_is_deterministic(source) -> None:
    sizes, kinds = training_plan(300, 6, np.random.default_rng(0))
    assert (sizes[:, :3] == [8, 20, 50]).all()
    assert sizes[:, 3:].min() >= 5 and sizes[:, 3:].max() <= 200
    assert (np.log(sizes[:, 3:]).mean() - np.log(np.sqrt(5 * 200))) ** 2 < 0.05  # log-uniform
    assert np.bincount(kinds.ravel()).tolist() == [600, 600, 600]
    _, _, _, src = source
    a = carve_training(src, [0, 1, 2, 3], 4, seed=3)
    b = carve_training(src, [0, 1, 2, 3], 4, seed=3)
    assert [e.query_id for e in a] == [e.query_id for e in b]
    assert all(np.array_equal(x.scores, y.scores) for x, y in zip(a, b))
    assert all(5 <= e.n_tools < N_TOOLS for e in a)
    assert carve_training(src, [0], 0) == []
