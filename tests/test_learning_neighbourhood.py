"""The usage memory's per-registry neighbourhood (registry.learning.neighbourhood): golden values
of the lift the fit replays, the served memory agreeing with it, the fit and its guard, and the
fitted value shipped, kept across a restart and forgotten by a wipe."""

from __future__ import annotations

import numpy as np

from registry.feedback import FeedbackRequest
from registry.learning.evidence import EvidenceConfig
from registry.learning.neighbourhood import fit_similarity, memory_lift
from registry.learning.profiles import ProfileConfig
from registry.learning.usage import UsageConfig, UsageMemory
from registry.request import ShortlistRequest
from tests.conftest import weather_tools

DIM = 16


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


def test_memory_lift_golden_values():
    sims = [np.array([0.9, 0.85]), np.array([0.7]), np.empty(0)]
    weights = [np.array([1.0, 2.0]), np.array([1.0]), np.empty(0)]
    lift = memory_lift(sims, weights, np.array([0.8, 0.6]), beta=0.3, n0=2.0)
    # tau 0.8: k = 0.5, 0.25 -> e = 1.0, 0, 0 -> 0.3 * 1 / (1 + 2)
    # tau 0.6: k = 0.75, 0.625 | 0.25 -> e = 2.0, 0.25 -> 0.3 * e / 4.25
    assert np.allclose(lift, [[0.1, 0.0, 0.0], [0.141176, 0.017647, 0.0]], atol=1e-6)


def test_the_served_memory_lifts_as_the_fit_replays(tmp_path):
    """``UsageMemory.boost`` at a registry's fitted neighbourhood equals :func:`memory_lift` on the
    same evidence (distinct callers, no share cap, entries far enough apart not to merge)."""
    rng = np.random.default_rng(3)
    memory = UsageMemory(lambda text: np.zeros(DIM), UsageConfig(evidence=EvidenceConfig(caller_share=1.0)))
    q = unit(rng.normal(size=DIM))
    vectors = [unit(q + 0.5 * rng.normal(size=DIM)) for _ in range(3)]
    tools = ["a", "a", "b"]

    class Event:
        def __init__(self, i: int) -> None:
            self.shortlist_id, self.registry, self.used = f"s{i}", "r", (tools[i],)
            self.success, self.calls, self.received = True, (), float(i)
            self.query, self.caller, self.shown = f"request {i}", f"c{i}", (tools[i],)

    for i, v in enumerate(vectors):
        assert memory.observe(Event(i), vector=v) == "counted"
    for tau in (0.3, 0.6):
        memory.set_similarity("r", tau)
        assert memory.similarity("r") == tau
        lifted = memory.boost("r", q, ["a", "b", "c"], np.zeros(3, np.float32))
        sims = [np.array([vectors[0] @ q, vectors[1] @ q]), np.array([vectors[2] @ q]), np.empty(0)]
        ones = [np.ones(2), np.ones(1), np.empty(0)]
        expected = memory_lift(sims, ones, np.array([tau]), beta=0.3, n0=2.0)[0]
        assert np.allclose(lifted, expected, atol=1e-5), (tau, lifted, expected)
    memory.set_similarity("r", None)
    assert memory.similarity("r") == 0.8  # back to the configured one
    memory.set_similarity("r", 0.6)
    memory.wipe("r", 100.0)
    assert memory.similarity("r") == 0.8


def clustered_events(share_tools: bool, n: int = 400, seed: int = 0):
    """Requests in 8 clusters (within-cluster cosine about 0.9). ``share_tools``: a cluster's
    requests use its one tool, which the base ranking puts second behind another cluster's
    tool; else a cluster's requests use one of two sibling tools at random, which the base
    ranking gets right (first) by a small margin."""
    rng = np.random.default_rng(seed)
    centers = np.stack([unit(rng.normal(size=DIM)) for _ in range(8)])
    vecs, used, cands, scores = [], [], [], []
    for _ in range(n):
        c = int(rng.integers(8))
        vecs.append(unit(centers[c] + 0.09 * rng.normal(size=DIM)))
        if share_tools:
            tool, other = c, (c + 1) % 8
            cands.append(np.array([other, tool, *[t for t in range(16) if t not in (tool, other)]]))
            scores.append(np.array([0.52, 0.50, *np.linspace(0.4, 0.1, 14)]))
        else:
            tool = 2 * c + int(rng.integers(2))
            other = tool ^ 1
            cands.append(np.array([tool, other, *[t for t in range(16) if t not in (tool, other)]]))
            scores.append(np.array([0.52, 0.50, *np.linspace(0.4, 0.1, 14)]))
        used.append([tool])
    return np.stack(vecs), used, cands, scores


def fit(share_tools: bool, n: int = 400):
    vecs, used, cands, scores = clustered_events(share_tools, n)
    return fit_similarity(
        vecs, used, [f"c{i % 10}" for i in range(n)], ProfileConfig(), candidates=cands, base_scores=scores,
        keys=[f"request number {i}" for i in range(n)],
    )


def test_a_neighbourhood_ships_where_neighbours_use_the_same_tool():
    tau, report = fit(share_tools=True)
    assert report["reason"] == "shipped", report
    assert tau is not None and tau < 0.99 and report["gain_lower"] > 0
    assert report["mrr_by_similarity"][str(tau)] > report["mrr_by_similarity"]["0.99"]


def test_repeats_only_where_neighbours_name_other_tools():
    """BFCL's case: requests for different tools sit close together; a wide neighbourhood lifts
    the sibling as much as the right tool, so the fit keeps the memory to repeats."""
    tau, report = fit(share_tools=False)
    assert tau == 0.99, report
    assert report["reason"].startswith("repeats only")
    assert report["mrr_by_similarity"]["0.6"] < report["mrr_by_similarity"]["0.99"]


def test_a_neighbourhood_never_costs_requests_for_tools_without_feedback():
    """Held-out requests of a cluster whose tool never appears in the fitting part: a wide
    neighbourhood lifts its neighbour's tool over theirs, so no such neighbourhood is chosen."""
    vecs, used, cands, scores = clustered_events(share_tools=True, n=400)
    keys = [f"request number {i}" for i in range(400)]
    from registry.learning.profiles import held_out

    for i in range(400):  # cluster 0's tool: only ever asked for in held-out requests, and
        if used[i] == [0] and not held_out(keys[i]):  # its fitting-part requests are cluster 7's
            used[i] = [7]
        if used[i] == [0]:  # held out: the base ranking gets it right, a neighbour's tool close
            cands[i] = np.array([0, 7, *[t for t in range(16) if t not in (0, 7)]])
            scores[i] = np.array([0.52, 0.515, *np.linspace(0.4, 0.1, 14)])
    tau, report = fit_similarity(
        vecs, used, [f"c{i % 10}" for i in range(400)], ProfileConfig(), candidates=cands, base_scores=scores,
        keys=keys,
    )
    assert report["unseen_scored_events"] > 0, report
    unseen = report["unseen_mrr_by_similarity"]
    assert unseen["0.6"] < unseen["0.99"]  # the widest neighbourhood lifts cluster 7's tool over 0
    assert tau is not None and unseen[str(tau)] >= unseen["0.99"]
    seen_best = max(report["mrr_by_similarity"], key=lambda t: report["mrr_by_similarity"][t])
    assert unseen[seen_best] < unseen["0.99"] and str(tau) != seen_best  # the guard chose another


def test_thin_data_fits_nothing():
    vecs, used, cands, scores = clustered_events(share_tools=True, n=40)
    tau, report = fit_similarity(vecs, used, ["c"] * 40, ProfileConfig(), candidates=cands, base_scores=scores,
                                 keys=[f"r {i}" for i in range(40)])
    assert tau is None and "needs" in report["reason"]


def test_a_refit_ships_the_neighbourhood_it_survives_restart_and_wipe(make_core, settings):
    """A refit fits the neighbourhood first (its report under ``profile.neighbourhood``), the
    control record keeps it across a restart, the learning report shows it, a wipe forgets it."""
    core = make_core()
    core.put_registry("w", weather_tools())
    for i in range(150):
        tool = "convert_currency" if i % 2 else "get_weather"
        text = f"convert {i} dollars to euros" if i % 2 else f"weather in city number {i}"
        sl = core.shortlist(ShortlistRequest("w", text), caller=f"c{i % 10}")
        core.feedback(FeedbackRequest(sl.shortlist_id, [tool], success=True), caller=f"c{i % 10}")
    job = core.policies.refit("w")
    hood = job.estimate["profile"]["neighbourhood"]
    assert hood["events"] == 150 and "mrr_by_similarity" in hood, hood
    tau = hood["similarity"]
    assert core.learning.memory.similarity("w") == tau
    report = core.learning_report("w")
    assert report["similarity"] == tau and report["similarity_fit"]["reason"] == hood["reason"]
    core.close()
    again = make_core()
    assert again.wait_ready(30)
    assert again.learning.memory.similarity("w") == tau
    again.wipe_learning("w")
    assert again.learning.memory.similarity("w") == settings.learning_similarity
    assert again.learning_report("w")["similarity_fit"] is None
