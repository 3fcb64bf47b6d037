"""Evaluation library and the `shortlist train` / `shortlist evaluate` commands, on tiny fixtures.

Fixtures: tests/fixtures/eval_weather and eval_office (tools.json + queries.jsonl, some queries
with gold_alternatives), and multi-tool queries over the office tools written per test.
BM25 or the hashing embedder only: no model download, fast.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from registry.bor import p_rand_all
from registry.offline.datasets import LabelledQuery, needed_groups
from registry.offline.episodes import Episode
from registry.offline.evaluate import (
    DEFAULT_BUCKETS,
    RankedSet,
    candidate_episodes,
    depth_efficiency,
    evaluate_ranked,
    fixed_curve,
    fixed_found_at,
    k_equivalent,
    load_or_build_table,
    needed_ranks,
    policy_metrics,
    rank_table,
    score_table,
)
from registry.offline.metrics import found_at

FIXTURES = Path(__file__).resolve().parent / "fixtures"
WEATHER = FIXTURES / "eval_weather"
OFFICE = FIXTURES / "eval_office"
ROOT = Path(__file__).resolve().parent.parent


def _ep(first: int, n: int = 100, length: int = 30) -> Episode:
    return Episode(scores=np.linspace(1, 0, length), gold_ranks=np.array([first]), n_tools=n)


# ----------------------------------------------------------------------------- maths


def test_k_equivalent_interpolates_the_fixed_curve() -> None:
    curve = np.array([0.0, 0.5, 0.8, 0.9, 0.9, 1.0])  # found at K = 0..5
    assert k_equivalent(curve, 0.5) == pytest.approx(1.0)
    assert k_equivalent(curve, 0.65) == pytest.approx(1.5)
    assert k_equivalent(curve, 0.85) == pytest.approx(2.5)
    assert k_equivalent(curve, 0.9) == pytest.approx(3.0)  # flat stretch: the smallest depth
    assert k_equivalent(curve, 0.95) == pytest.approx(4.5)
    assert k_equivalent(curve, 0.25) == pytest.approx(0.5)  # below K=1: towards found(0) = 0
    assert k_equivalent(curve, 0.0) == 0.0
    assert math.isinf(k_equivalent(curve[:4], 0.95))  # no fixed depth up to the cap finds as often
    assert depth_efficiency(curve, 0.85, 1.25) == pytest.approx(2.0)


def test_fixed_curve_counts_hits_and_caps_per_episode() -> None:
    eps = [_ep(0), _ep(1), _ep(3), _ep(40, length=30)]  # the last one is out of reach
    curve = fixed_curve(eps, 5)
    np.testing.assert_allclose(curve, [0, 0.25, 0.5, 0.5, 0.75, 0.75])


def test_policy_metrics_buckets_bits_and_equivalence() -> None:
    exact = [_ep(0), _ep(2), _ep(9), _ep(30, length=60)]
    # the second query has an equivalent tool at rank 0, so it counts as found at K = 1
    equiv = [_ep(0), Episode(np.linspace(1, 0, 30), np.array([0, 2]), 100), _ep(9), _ep(30, length=60)]
    ranked = RankedSet("synthetic", "test", exact, equiv)
    m = policy_metrics("fixed K=1", np.ones(4, dtype=np.int64), ranked, 20)
    assert m["found"] == 0.25 and m["found_equiv"] == 0.5
    assert m["mean_k"] == 1.0 and m["k_std"] == 0.0 and m["distinct_k"] == 1
    assert m["mean_p_rand"] == pytest.approx(1 / 100)
    assert m["bor_bits"] == pytest.approx(math.log2(0.25 * 100))
    assert m["k_eq"] == pytest.approx(1.0) and m["efficiency"] == pytest.approx(1.0)
    by = {b["bucket"]: b for b in m["buckets"]}
    assert [by[name]["n"] for name, _, _ in DEFAULT_BUCKETS] == [1, 1, 1, 1]
    assert by["easy"]["found"] == 1.0 and by["medium"]["found"] == 0.0
    # an adaptive depth: 1 on the easy query, 3 on the medium one, 10 on the hard one
    ks = np.array([1, 3, 10, 2])
    m = policy_metrics("adaptive", ks, ranked, 20)
    assert m["found"] == 0.75 and m["mean_k"] == 4.0
    # fixed curve: found(K) = 0.25 (K=1,2), 0.5 (K=3..9), 0.75 (K>=10) -> K_eq = 10
    assert m["k_eq"] == pytest.approx(10.0) and m["efficiency"] == pytest.approx(2.5)
    assert by["easy"]["mean_k"] == 1.0
    assert {b["bucket"]: b["mean_k"] for b in m["buckets"]}["hard"] == 10.0


def test_evaluate_ranked_reports_fixed_baselines_and_policies() -> None:
    eps = [_ep(r) for r in (0, 0, 1, 4, 12)]
    ranked = RankedSet("synthetic", "test", eps, eps)
    rep = evaluate_ranked(ranked, {"always 2": lambda s, n, k: 2}, cap=10, fixed_ks=(1, 3, 5, 10, 20))
    names = [p["policy"] for p in rep["policies"]]
    assert names == ["fixed K=1", "fixed K=3", "fixed K=5", "fixed K=10", "always 2"]  # 20 > cap
    assert rep["found_at"]["1"] == pytest.approx(0.4)
    assert rep["policies"][-1]["found"] == pytest.approx(0.6)
    assert len(rep["fixed_curve"]) == 11


# ----------------------------------------------------------------------------- every needed tool


def _multi(ranks: list[int], n: int = 100, length: int = 30) -> Episode:
    return Episode(scores=np.linspace(1, 0, length), gold_ranks=np.array(ranks), n_tools=n)


def test_all_found_needs_every_gold_rank_below_k() -> None:
    eps = [_multi([0, 3]), _multi([1]), _multi([2, 40]), _multi([0, 1, 2])]  # 40: out of reach
    assert needed_ranks(eps, "any").tolist() == [0, 1, 2, 0]
    assert needed_ranks(eps, "all").tolist() == [3, 1, 40, 2]
    np.testing.assert_allclose(fixed_curve(eps, 5), [0, 0.5, 0.75, 1, 1, 1])
    np.testing.assert_allclose(fixed_curve(eps, 5, need="all"), [0, 0, 0.25, 0.5, 0.75, 0.75])
    # found_at does not cap at the kept list: rank 40 counts at K = 41
    assert found_at(eps, 4, need="all") == 0.75 and found_at(eps, 41, need="all") == 1.0
    assert found_at(eps, 1) == 0.5
    assert fixed_found_at(np.array([0, 0.2, 0.6]), 1.5) == pytest.approx(0.4)
    with pytest.raises(ValueError):
        needed_ranks(eps, "most")


def test_policy_metrics_report_all_found_next_to_any() -> None:
    exact = [_multi([0, 3]), _multi([1]), _multi([2, 40]), _multi([0, 1, 2])]
    ranked = RankedSet("multi", "test", exact, exact)
    ks = np.array([4, 1, 3, 2])
    m = policy_metrics("adaptive", ks, ranked, 10)
    assert m["found"] == 0.75  # the single-gold query at rank 1 is missed at K = 1
    assert m["found_all"] == 0.25  # only the first query shows both of its tools
    assert m["found_all_equiv"] == 0.25 and m["n_multi_gold"] == 3
    assert m["mean_k"] == 2.5
    # mean P_rand_all over the episodes: R = 2, 1, 2, 3 at K = 4, 1, 3, 2 (the last is 0: K < R)
    want_pr = (p_rand_all(100, 2, 4) + p_rand_all(100, 1, 1) + p_rand_all(100, 2, 3) + 0.0) / 4
    assert m["mean_p_rand_all"] == pytest.approx(want_pr, rel=1e-12)
    assert m["bor_bits_all"] == pytest.approx(math.log2(0.25 / want_pr), rel=1e-12)
    # fixed all-found curve: 0 (K<=1), 0.25 (K=2), 0.5 (K=3), 0.75 (K>=4, rank 40 out of reach)
    assert m["fixed_found_all_at_mean_k"] == pytest.approx(0.375)
    assert m["found_all_margin"] == pytest.approx(0.25 - 0.375)
    assert m["k_eq_all"] == pytest.approx(2.0) and m["efficiency_all"] == pytest.approx(0.8)
    assert {b["bucket"]: b["found_all"] for b in m["buckets"]}["easy"] == 0.5
    # any-found keys are unchanged by the addition
    assert m["fixed_found_at_mean_k"] == pytest.approx(fixed_found_at(fixed_curve(exact, 10), 2.5))


def test_all_found_counts_a_gold_tool_found_through_its_equivalent() -> None:
    exact = [_multi([0, 5]), _multi([4])]
    equiv = [_multi([0, 1, 5]), _multi([0, 4])]  # flat hit sets: gold plus alternatives
    # per gold tool, its best rank counting equivalents: the second tool's twin sits at rank 1
    all_equiv = [_multi([0, 1]), _multi([0])]
    ranked = RankedSet("eq", "test", exact, equiv, {}, all_equiv)
    m = policy_metrics("fixed K=2", np.array([2, 2]), ranked, 10)
    assert m["found_all"] == 0.0 and m["found_all_equiv"] == 1.0
    assert m["found"] == 0.5 and m["found_equiv"] == 1.0
    # without all_equiv (hand-built sets): a single-gold query takes its best equivalent; a
    # multi-gold one cannot attribute alternatives and keeps its exact ranks
    fallback = RankedSet("eq", "test", exact, equiv).needed_equiv()
    assert [e.gold_ranks.tolist() for e in fallback] == [[0, 5], [0]]


def test_needed_groups_attribute_alternatives_to_gold_tools() -> None:
    single = LabelledQuery("a", "q", ("send_email",), (("share_file",), ("post_chat_message",)))
    assert needed_groups(single) == [("post_chat_message", "send_email", "share_file")]
    parallel = LabelledQuery("b", "q", ("send_email", "create_task"), (("share_file",), ("set_reminder",)))
    assert needed_groups(parallel) == [("send_email", "share_file"), ("create_task", "set_reminder")]
    named = LabelledQuery("c", "q", ("send_email", "create_task"), (("create_task", "set_reminder"),))
    assert needed_groups(named) == [("send_email",), ("create_task", "set_reminder")]
    loose = LabelledQuery("d", "q", ("send_email", "create_task"), (("share_file",),))
    assert needed_groups(loose) == [("send_email",), ("create_task",)]


MULTI_QUERIES: list[dict[str, Any]] = [
    {"id": "m0", "query": "share the file with bob and remind me to follow up",
     "gold": ["send_email", "create_task"], "gold_alternatives": [["share_file"], ["set_reminder"]]},
    {"id": "m1", "query": "translate the memo to French and then summarize it",
     "gold": ["translate_text", "summarize_text"]},
    {"id": "m2", "query": "schedule a meeting with Anna and start a video call now",
     "gold": ["create_calendar_event", "start_video_call"]},
    {"id": "m3", "query": "convert 100 dollars to euros, log it as an expense and invoice the client",
     "gold": ["convert_currency", "track_expense", "create_invoice"]},
    {"id": "s0", "query": "read my inbox", "gold": ["read_inbox"]},
]


@pytest.fixture
def multi_dir(tmp_path: Path) -> Path:
    d = tmp_path / "eval_multi"
    d.mkdir()
    shutil.copy(OFFICE / "tools.json", d / "tools.json")
    (d / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in MULTI_QUERIES))
    return d


def test_rankings_carry_every_gold_rank_and_the_needed_groups(multi_dir: Path, tmp_path: Path) -> None:
    table = score_table(multi_dir, None)
    assert table.meta["n_multi_gold"] == 4
    ranked = rank_table(table, "bm25")
    names = table.tool_names
    scores = table.scores("bm25")
    for i, (ex, ae) in enumerate(zip(ranked.exact, ranked.all_equiv or [])):
        assert ex.n_gold == len(MULTI_QUERIES[i]["gold"])
        order = np.lexsort((np.arange(len(names)), -scores[i]))
        rank_of = {names[t]: r for r, t in enumerate(order)}
        assert sorted(ex.gold_ranks.tolist()) == sorted(rank_of[g] for g in MULTI_QUERIES[i]["gold"])
        groups = needed_groups(LabelledQuery(
            "x", "q", tuple(MULTI_QUERIES[i]["gold"]),
            tuple(tuple(g) for g in MULTI_QUERIES[i].get("gold_alternatives", [])),
        ))
        assert sorted(ae.gold_ranks.tolist()) == sorted(min(rank_of[t] for t in g) for g in groups)
    # the cached table keeps the groups
    first = load_or_build_table(multi_dir, None, cache_dir=tmp_path / "cache")
    again = load_or_build_table(multi_dir, None, cache_dir=tmp_path / "cache")
    assert [[g.tolist() for g in again.needed(i)] for i in range(again.n_queries)] == [
        [g.tolist() for g in first.needed(i)] for i in range(first.n_queries)
    ]
    assert [len(again.needed(i)) for i in range(again.n_queries)] == [2, 2, 2, 3, 1]
    # candidate sets carry them too
    cand = candidate_episodes(table, "bm25", 8, n_hard=3, seed=0)
    assert cand.all_equiv is not None
    for ex, ae in zip(cand.exact, cand.all_equiv):
        assert ae.n_gold == ex.n_gold and ae.gold_ranks.max() <= ex.gold_ranks.max()


def test_evaluate_ranked_reports_all_found_curves(multi_dir: Path) -> None:
    ranked = rank_table(score_table(multi_dir, None), "bm25")
    rep = evaluate_ranked(ranked, {"always 3": lambda s, n, k: 3}, cap=10)
    assert rep["n_multi_gold"] == 4 and len(rep["fixed_curve_all"]) == 11
    lasts = needed_ranks(ranked.exact, "all")
    assert rep["found_all_at"]["5"] == pytest.approx(float(np.mean(lasts < 5)))
    for p in rep["policies"]:
        assert p["found_all"] <= p["found"] and p["found_all"] <= p["found_all_equiv"]
    k3 = next(p for p in rep["policies"] if p["policy"] == "fixed K=3")
    assert k3["found_all"] == pytest.approx(rep["fixed_curve_all"][3])
    assert rep["policies"][-1]["found_all"] == k3["found_all"]
    assert rep["fixed_curve_all"][1] == 0.2  # only the single-tool query can be complete at K=1
    # BM25 ranks m0's gold tools 3rd and 10th but their equivalents (share_file, set_reminder)
    # 1st and 2nd: at K = 3 every needed tool of m1, m3, s0 is shown, and of m0 only via twins
    assert k3["found_all"] == pytest.approx(0.6) and k3["found_all_equiv"] == pytest.approx(0.8)
    assert rep["fixed_curve_all_equiv"][2] == pytest.approx(0.6) and rep["fixed_curve_all"][2] == 0.4


# ----------------------------------------------------------------------------- tables and rankings


def test_score_table_reads_gold_and_alternatives() -> None:
    table = score_table(WEATHER, None)
    assert table.n_tools == 16 and table.n_queries == 22
    assert table.dense is None
    names = table.tool_names
    row = table.query_ids.index("eval_weather_1")
    assert [names[i] for i in table.gold[row]] == ["get_weather"]
    assert sorted(names[i] for i in table.hits[row]) == ["get_weather", "get_weather_forecast"]
    assert table.meta["n_with_alternatives"] == 4
    with pytest.raises(ValueError):
        table.scores("dense")


def test_rankings_match_the_serving_scorer(hashing_embedder) -> None:
    """The evaluation ranks as the service does: same scores, same fusion, same tie-breaking
    (except the dense scorer's exact ties, which FAISS orders its own way)."""
    from registry.offline.datasets import index_dataset, load_dataset, rank_queries

    table = score_table(OFFICE, hashing_embedder)
    data = load_dataset(OFFICE)
    snapshot = index_dataset(data.tools, hashing_embedder)
    for scorer in ("dense", "bm25", "hybrid"):
        ours = rank_table(table, scorer).exact
        served = rank_queries(snapshot, data.queries, hashing_embedder, scorer, depth=60)
        for a, b in zip(ours, served):
            assert a.query_id == b.query_id
            np.testing.assert_allclose(a.scores, b.scores, atol=1e-6)
            if scorer == "dense":  # the gold tool's score is the same, within a tie block
                for ra, rb in zip(a.gold_ranks, b.gold_ranks):
                    if max(ra, rb) < a.scores.size:
                        assert a.scores[ra] == pytest.approx(b.scores[rb], abs=1e-6)
            else:
                np.testing.assert_array_equal(a.gold_ranks, b.gold_ranks)


def test_table_cache_roundtrip(tmp_path: Path, hashing_embedder) -> None:
    first = load_or_build_table(OFFICE, hashing_embedder, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("eval_office-*.npz"))) == 1
    again = load_or_build_table(OFFICE, hashing_embedder, cache_dir=tmp_path)
    np.testing.assert_array_equal(first.dense, again.dense)
    np.testing.assert_array_equal(first.lexical, again.lexical)
    assert [g.tolist() for g in first.hits] == [g.tolist() for g in again.hits]
    assert first.query_ids == again.query_ids and first.meta == again.meta


def test_candidate_sets_follow_the_paper_protocol(hashing_embedder) -> None:
    table = score_table(OFFICE, hashing_embedder)
    n, n_hard = 8, 3
    ranked = candidate_episodes(table, "bm25", n, n_hard=n_hard, seed=0)
    again = candidate_episodes(table, "bm25", n, n_hard=n_hard, seed=0)
    for i, (ep, eq) in enumerate(zip(ranked.exact, ranked.equiv)):
        assert ep.n_tools == n and ep.scores.size == n
        assert ep.n_gold == table.gold[i].size and eq.n_gold == table.hits[i].size
        assert eq.first_gold_rank <= ep.first_gold_rank
        # the candidates' BM25 scores are a subset of the registry's, ranked descending
        assert np.all(np.diff(ep.scores) <= 1e-7)
        assert set(np.round(ep.scores, 5)) <= set(np.round(table.lexical[i], 5))
    assert [e.scores.tolist() for e in ranked.exact] == [e.scores.tolist() for e in again.exact]
    # no random fill: the set is the gold plus the top hard distractors, so a gold tool ranked
    # within the top n - |hits| of the registry keeps its rank
    full = rank_table(table, "dense").exact
    hard_only = candidate_episodes(table, "dense", n, n_hard=None)
    for f, c, hits in zip(full, hard_only.exact, table.hits):
        if f.first_gold_rank < n - hits.size:
            assert c.first_gold_rank == f.first_gold_rank


# ----------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def trained_cli_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch  # noqa: F401  (the [test] extra installs [train]; a missing torch is a broken install)

    from service.cli import main

    out = tmp_path_factory.mktemp("cli") / "policy"
    rc = main([
        "train", "--data", str(WEATHER), str(OFFICE), "--scorer", "bm25", "--seed", "3",
        "--steps", "150", "--max-depth", "10", "--candidate-sizes", "8", "full",
        "--holdout-fraction", "0.25", "--out", str(out),
    ])
    assert rc == 0
    return out


def test_cli_train_on_data_directories(trained_cli_policy: Path) -> None:
    from registry.serving.depth_policies import OnnxDepthPolicy

    policy = OnnxDepthPolicy.from_dir(trained_cli_policy)
    m = policy.manifest
    assert m["scorer"] == "bm25" and m["seed"] == 3 and m["max_depth"] == 10
    assert m["training_data"]["candidate_sizes"] == [8, "full"]
    assert [Path(f["path"]).name for f in m["training_data"]["files"]] == ["eval_weather", "eval_office"]
    assert set(m["metrics"]["holdout"]) == {"eval_weather", "eval_office", "all"}
    assert "efficiency" in m["metrics"]["holdout"]["all"]
    scores = np.linspace(1.0, 0.0, 16).astype(np.float32)
    assert 1 <= policy.choose_depth(scores, 16, 10) <= 10


def test_cli_train_learns_the_scores_of_the_embedder_asked(tmp_path: Path, minilm_cache: Path) -> None:
    """``--embedder tuned`` scores the training sets with the tuned model, so the policy learns the
    score shapes it will be served with; the manifest names that model, not plain MiniLM."""
    import torch  # noqa: F401  (the [test] extra installs [train]; a missing torch is a broken install)

    from registry.serving.depth_policies import OnnxDepthPolicy
    from service.cli import main

    models = {}
    for name in ("minilm", "tuned"):
        out = tmp_path / name
        rc = main([
            "train", "--data", str(WEATHER), "--scorer", "dense", "--embedder", name,
            "--embedder-cache", str(minilm_cache), "--steps", "20", "--max-depth", "5",
            "--holdout-fraction", "0.25", "--out", str(out),
        ])
        assert rc == 0
        models[name] = OnnxDepthPolicy.from_dir(out).manifest["training_data"]["files"][0]["meta"]["embedder"]
    assert models["minilm"].startswith("all-MiniLM-L6-v2/")
    assert models["tuned"].startswith("all-MiniLM-L6-v2+tool-finetune/")


def test_cli_train_rejects_an_unknown_embedder(capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", "--data", str(WEATHER), "--embedder", "bert"])
    assert exc.value.code == 2
    assert "--embedder" in capsys.readouterr().err


def test_cli_evaluate_writes_tables_and_plots(trained_cli_policy: Path, tmp_path: Path) -> None:
    from service.cli import main

    out = tmp_path / "eval"
    rc = main([
        "evaluate", "--data", str(WEATHER), str(OFFICE), "--policy", str(trained_cli_policy),
        "--scorer", "bm25", "--cap", "10", "--out", str(out), "--img", str(tmp_path / "img"),
    ])
    assert rc == 0
    reports = json.loads((out / "results.json").read_text())
    assert [r["dataset"] for r in reports] == ["eval_weather", "eval_office"]
    for rep in reports:
        names = [p["policy"] for p in rep["policies"]]
        assert names[:4] == ["fixed K=1", "fixed K=3", "fixed K=5", "fixed K=10"]
        assert "gap" in names and "bor:policy" in names
        for p in rep["policies"]:
            assert p["found_equiv"] >= p["found"]
            assert sum(b["n"] for b in p["buckets"]) == rep["n"]
        k1 = rep["policies"][0]
        assert k1["found_equiv"] > k1["found"]  # the fixtures' alternatives count at K = 1
    md = (out / "results.md").read_text()
    assert "found % (equiv.)" in md and "efficiency" in md and "very hard" in md
    for rep in reports:
        for kind in ("figure1", "curve"):
            png = tmp_path / "img" / f"{kind}_{rep['dataset']}_bm25.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert f"](../img/{png.name})" in md  # linked relative to results.md


def test_cli_evaluate_candidate_sets(trained_cli_policy: Path, tmp_path: Path) -> None:
    from registry.offline.evaluate_cli import main

    rc = main([
        "--data", str(OFFICE), "--policy", str(trained_cli_policy), "--scorer", "bm25",
        "--candidates", "6", "--hard", "2", "--cap", "6", "--buckets", "1,2-3,4+",
        "--no-plots", "--out", str(tmp_path),
    ])
    assert rc == 0
    (rep,) = json.loads((tmp_path / "results.json").read_text())
    assert rep["n_tools"] == "6" and [b[0] for b in rep["buckets"]] == ["1", "2-3", "4+"]
    assert not list(tmp_path.glob("*.png"))


def test_cli_evaluate_sweeps_the_operating_knob(trained_cli_policy: Path, tmp_path: Path) -> None:
    from registry.offline.evaluate_cli import main

    rc = main([
        "--data", str(OFFICE), "--policy", str(trained_cli_policy), "--scorer", "bm25", "--cap", "10",
        "--depth-bias", "-10", "0", "0.5", "10", "--no-plots", "--out", str(tmp_path),
    ])
    assert rc == 0
    (rep,) = json.loads((tmp_path / "results.json").read_text())
    by = {p["policy"]: p for p in rep["policies"]}
    assert {"bor:policy@-10", "bor:policy", "bor:policy@+0.5", "bor:policy@+10"} <= set(by)
    ks = [by[n]["mean_k"] for n in ("bor:policy@-10", "bor:policy", "bor:policy@+0.5", "bor:policy@+10")]
    # +10 bits walks to the cap, or to half the registry (policy_depth_limit) when that is lower
    from registry.serving.depth_policies import policy_depth_limit

    deepest = min(10, policy_depth_limit(int(rep["n_tools"])))
    assert ks == sorted(ks) and ks[0] == 1.0 and ks[-1] == deepest
    assert by["bor:policy@+10"]["found"] == pytest.approx(rep["fixed_curve"][deepest])
    with pytest.raises(SystemExit):
        main(["--data", str(OFFICE), "--depth-bias", "11", "--out", str(tmp_path)])


def test_cli_evaluate_prints_and_writes_any_and_all_found(
    multi_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    out = tmp_path / "eval"
    rc = main(["evaluate", "--data", str(multi_dir), "--scorer", "bm25", "--cap", "10",
               "--out", str(out)])
    assert rc == 0
    assert (out / "curve_eval_multi_bm25.png").read_bytes()[:4] == b"\x89PNG"  # with the all curve
    (rep,) = json.loads((out / "results.json").read_text())
    assert rep["n_multi_gold"] == 4 and "fixed_curve_all" in rep and "found_all_at" in rep
    for p in rep["policies"]:
        assert {"found", "found_all", "found_all_equiv", "bor_bits_all", "fixed_found_all_at_mean_k"} <= set(p)
        assert p["found_all"] <= p["found"]
    k1 = rep["policies"][0]
    assert k1["policy"] == "fixed K=1" and k1["found_all"] == 0.2  # one single-tool query of five
    md = (out / "results.md").read_text()
    assert "| all found % |" in md and "every gold tool found@1/5/10: 20.0 / " in md
    assert "4 of 5 queries need >= 2 tools" in md
    err = capsys.readouterr().err
    gap_row = next(p for p in rep["policies"] if p["policy"] == "gap")
    assert f"all found {100 * gap_row['found_all']:5.1f}%" in err


def test_markdown_reads_reports_written_before_all_found() -> None:
    from registry.offline.evaluate import markdown_tables

    ranked = RankedSet("old", "test", [_ep(0), _ep(3)], [_ep(0), _ep(3)])
    rep = evaluate_ranked(ranked, {}, cap=5, fixed_ks=(1,))
    for key in ("n_multi_gold", "fixed_curve_all", "fixed_curve_all_equiv", "found_all_at"):
        del rep[key]
    for p in rep["policies"]:
        for key in [k for k in p if "all" in k]:
            del p[key]
    md = markdown_tables([rep])
    assert "| fixed K=1 | 50.0 | 50.0 | – | – |" in md


# ----------------------------------------------------------------------------- start-up refusal


def _policy_with_schema(tmp_path: Path, version: str) -> Path:
    target = tmp_path / "policy"
    shutil.copytree(ROOT / "models" / "default", target)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["feature_schema_version"] = version
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def test_app_refuses_a_policy_of_another_feature_schema(tmp_path: Path) -> None:
    from registry.errors import PolicySchemaMismatch
    from service.app import create_app
    from service.settings import ServiceSettings

    settings = ServiceSettings(data_dir=tmp_path / "data", demo_registry=None,
                        policy_dir=_policy_with_schema(tmp_path, "0-old"))
    with pytest.raises(PolicySchemaMismatch, match="feature schema"):
        create_app(settings)


def test_server_process_exits_on_a_feature_schema_mismatch(tmp_path: Path) -> None:
    import os

    env = dict(
        os.environ,
        SHORTLIST_POLICY_DIR=str(_policy_with_schema(tmp_path, "0-old")),
        SHORTLIST_DATA_DIR=str(tmp_path / "data"),
        SHORTLIST_DEMO_REGISTRY="",
        SHORTLIST_PORT="1",  # never bound: start-up must fail before serving
    )
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve"], env=env, cwd=ROOT,
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "feature schema" in proc.stderr and "0-old" in proc.stderr
