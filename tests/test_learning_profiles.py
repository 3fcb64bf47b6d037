"""Usage profiles (registry.learning.profiles) and the evidence rule (registry.learning.evidence):
golden values, the fitted weight and its guard, bounds."""

from __future__ import annotations

import numpy as np
import pytest

from registry.learning.evidence import EvidenceConfig, EvidenceCounter, decay_weight
from registry.learning.profiles import (
    ProfileConfig,
    build_profiles,
    event_weights,
    fit_weight,
    profile_lift,
)


def unit(*v: float) -> np.ndarray:
    a = np.array(v, np.float32)
    return a / np.linalg.norm(a)


def test_decay_golden_values():
    assert [round(decay_weight(j, 4.0), 4) for j in range(6)] == [1.0, 0.8, 0.6667, 0.5714, 0.5, 0.4444]
    weights = event_weights(["a"] * 10 + ["b"], [[0]] * 11, ProfileConfig())
    assert round(sum(w[0] for w in weights[:10]), 3) == 5.387  # 10 repeats of one claim
    assert weights[10] == {0: 1.0}  # another caller starts afresh


def test_soft_share_scales_a_dominant_caller():
    counter = EvidenceCounter(EvidenceConfig(caller_share=0.2, min_events=5))
    for i in range(10):
        counter.weigh(f"h{i}", [f"t{i}"], 0.0)
    w = counter.weigh("x", ["t"], 0.0)["t"]
    assert w == 1.0  # 1 of 11: within its share
    for j in range(20):
        counter.weigh("x", [f"u{j}"], 0.0)
    share = counter.weight["x"] / counter.total
    assert 0.2 < share < 0.6 and counter.weigh("x", ["v"], 0.0)["v"] < 0.5


def test_a_dominant_caller_settles_at_its_share_and_still_counts():
    """Issue 23: the soft share let a caller sending half the events keep ~29% of the evidence
    (57% at 90%); each event now counts only up to the caller's share, never less than 5%."""
    import random

    for p in (0.3, 0.5, 0.9):
        counter = EvidenceCounter(EvidenceConfig(caller_share=0.2))
        rng = random.Random(1)
        for i in range(3000):
            if rng.random() < p:
                counter.weigh("dominant", [f"d{rng.randrange(200)}"], i / 2)
            else:
                counter.weigh(f"h{rng.randrange(10)}", [f"t{rng.randrange(200)}"], i / 2)
        before = counter.weight["dominant"]
        assert before / counter.total <= 0.2 + 0.02, (p, before / counter.total)
        w = counter.weigh("dominant", ["fresh"], 1500.0)["fresh"]
        assert w >= 0.05 and counter.weight["dominant"] > before  # bounded, never locked


def test_profile_lift_golden_values():
    tools = np.stack([unit(1, 0, 0), unit(0, 0, 1)])  # d_0, d_1
    q = unit(0, 1, 0)
    raw = ProfileConfig(n0=2.0, center=0)
    profiles = build_profiles(q[None, :], [[0]], ["a"], tools, raw)
    assert profiles.shrink.tolist() == pytest.approx([1 / 3])
    lift = profile_lift(profiles, q, np.array([1, 0]), raw)
    assert lift.tolist() == pytest.approx([0.0, 1 / 3])  # a_t * (cos(q, c_t) - cos(q, d_t)) = 1/3 * (1 - 0)
    probe = unit(1, 1, 0)  # half-way between the description and how users asked
    assert profile_lift(profiles, probe, np.array([0]), raw)[0] == pytest.approx(0.0, abs=1e-6)
    # only the first `candidates` can be lifted
    assert profile_lift(profiles, q, np.array([1, 0]), ProfileConfig(candidates=1)).tolist() == [0.0, 0.0]


def test_centered_profile_lift_golden_values_and_the_service_agrees():  # the ``center`` option
    """About the mean request mu = (1/sqrt2, 0, 0) of two tools asked for as (1, 1, 0) and
    (1, -1, 0): a request like tool 0's lifts it by 1/3 (unit(m_0 - mu) = (0, 1, 0)) and
    lowers tool 1 by 1/3, where raw cosines gave tool 1 nothing (cos 0) and, with a style
    shared by all requests, a lift: the style is what centering removes."""
    from registry.learning.usage import UsageConfig, UsageMemory

    qa, qb, d = unit(1, 1, 0), unit(1, -1, 0), unit(0, 0, 1)
    tools = np.stack([d, d])
    cfg = ProfileConfig(n0=2.0, center=1)
    profiles = build_profiles(np.stack([qa, qb]), [[0], [1]], ["a", "b"], tools, cfg)
    assert profiles.mean.tolist() == pytest.approx([2**-0.5, 0.0, 0.0], abs=1e-6)
    assert profile_lift(profiles, qa, np.array([0, 1]), cfg).tolist() == pytest.approx([1 / 3, -1 / 3], abs=1e-6)
    raw = ProfileConfig(n0=2.0, center=0)
    assert profile_lift(profiles, qa, np.array([0, 1]), raw).tolist() == pytest.approx([1 / 3, 0.0], abs=1e-6)
    memory = UsageMemory(lambda text: qa, UsageConfig(profile_center=True))
    reg = memory._new_registry()
    reg.add_profile("t0", qa, 1.0)
    reg.add_profile("t1", qb, 1.0)
    memory._registries["r"] = reg
    memory.set_weight("r", 1.0)
    served = memory.profile_lift("r", qa, ["t0", "t1"], tools)
    assert served.tolist() == pytest.approx([1 / 3, -1 / 3], abs=1e-5)
    # served: the lift never carries t0 over "new", a tool without a profile ranked above it
    ids, _ = memory.rerank("r", qa, ["new", "t0"], np.array([7, 0]), np.array([0.5, 0.45], np.float32),
                           np.array([0.0, served[0]], np.float32))
    assert ids.tolist() == [7, 0]
    ids, _ = memory.rerank("r", qa, ["t1", "t0"], np.array([1, 0]), np.array([0.5, 0.45], np.float32),
                           np.array([served[1], served[0]], np.float32))
    assert ids.tolist() == [0, 1]  # among profiled tools it reorders


def _needs(rng: np.random.Generator, n_tools: int, dim: int = 16):
    """Tools whose descriptions sit off the way users ask for them (a fixed rotation)."""
    asked = rng.normal(size=(n_tools, dim))
    asked /= np.linalg.norm(asked, axis=1, keepdims=True)
    described = asked + 0.9 * rng.normal(size=(n_tools, dim))
    described /= np.linalg.norm(described, axis=1, keepdims=True)
    return asked.astype(np.float32), described.astype(np.float32)


def _requests(rng: np.random.Generator, asked: np.ndarray, n: int):
    tools = rng.integers(0, len(asked), size=n)
    q = asked[tools] + 0.35 * rng.normal(size=(n, asked.shape[1]))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q.astype(np.float32), [[int(t)] for t in tools]


def test_the_weight_ships_when_profiles_help_new_phrasings():
    rng = np.random.default_rng(0)
    asked, described = _needs(rng, 20)
    q, used = _requests(rng, asked, 400)
    weight, report = fit_weight(q, used, [f"a{i % 10}" for i in range(400)], described, ProfileConfig(),
                                keys=[f"request {i}" for i in range(400)])
    assert weight > 0 and report["reason"] == "shipped" and report["gain_lower"] > 0
    assert report["mrr_by_weight"][str(weight)] > report["mrr_by_weight"]["0.0"]


def test_the_guard_refuses_a_weight_that_cannot_beat_the_base_ranking():
    rng = np.random.default_rng(1)
    asked, described = _needs(rng, 20)
    q, _ = _requests(rng, asked, 400)
    agree = [[int(np.argmax(described @ v))] for v in q]  # agents use what the ranking put first
    weight, report = fit_weight(q, agree, [None] * 400, described, ProfileConfig(),
                                keys=[f"request {i}" for i in range(400)])
    assert weight == 0.0 and report["reason"] != "shipped"


def test_the_split_keeps_one_request_on_one_side():
    """Repeats of a request never sit on both sides: a memory of them is not a new phrasing."""
    rng = np.random.default_rng(2)
    asked, described = _needs(rng, 20)
    q, used = _requests(rng, asked, 40)
    reps = np.repeat(q, 10, axis=0)
    keys = [f"Request  {i // 10}" if i % 2 else f"request {i // 10}" for i in range(400)]
    _, report = fit_weight(reps, [used[i // 10] for i in range(400)], [None] * 400, described,
                           ProfileConfig(min_fit_events=10), keys=keys)
    assert report["held_out_events"] % 10 == 0 and report["fit_events"] % 10 == 0


def test_thin_data_gives_no_weight():
    rng = np.random.default_rng(3)
    asked, described = _needs(rng, 5)
    q, used = _requests(rng, asked, 20)
    weight, report = fit_weight(q, used, [None] * 20, described, ProfileConfig())
    assert weight == 0.0 and "needs" in report["reason"]


def test_the_weight_never_costs_requests_for_tools_without_feedback():
    """Requests share a style the descriptions lack: every usage centroid carries it, so a
    profile lifts its tool over a tool nobody has used yet. The fitted weight must not cost the
    held-out requests whose tool has no profile (issue 22: unseen tool not lower than before)."""
    from registry.learning.profiles import held_out

    rng = np.random.default_rng(4)
    asked, described = _needs(rng, 20)
    style = rng.normal(size=16)
    style /= np.linalg.norm(style)
    q, used = _requests(rng, asked, 600)
    q = q + 0.8 * style.astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    keys = []
    for i, u in enumerate(used):  # tools 15-19 are only ever asked for in the held-out part
        j = 0
        while u[0] >= 15 and not held_out(f"request {i} {j}"):
            j += 1
        keys.append(f"request {i} {j}")
    callers = [f"a{i % 10}" for i in range(600)]
    unguarded = ProfileConfig(center=0, unseen_guard=0)
    weight, report = fit_weight(q, used, callers, described, unguarded, keys=keys)
    unseen = report["unseen_mrr_by_weight"]
    assert report["unseen_scored_events"] >= 20
    assert any(unseen[w] < unseen["0.0"] for w in unseen)  # raw cosines: some weight costs them
    assert unseen[str(report["best_weight"])] >= unseen["0.0"]  # the fit never picks one
    assert unseen[str(weight)] >= unseen["0.0"]
    # the defaults (never over an untried tool): no weight costs them
    weight, report = fit_weight(q, used, callers, described, ProfileConfig(), keys=keys)
    unseen = report["unseen_mrr_by_weight"]
    assert weight > 0 and all(unseen[w] >= unseen["0.0"] - 1e-9 for w in unseen)


def test_a_lift_never_passes_a_tool_without_a_profile_ranked_above():
    from registry.learning.profiles import capped_lift

    base = np.array([0.9, 0.8, 0.7, 0.6], np.float32)
    lift = np.array([0.0, 0.3, 0.5, -0.2], np.float32)
    profiled = np.array([False, True, True, True])
    out = capped_lift(base, lift, profiled)
    assert out[1] == pytest.approx(0.1, abs=1e-5) and base[1] + out[1] < base[0]  # held below
    assert base[2] + out[2] < base[0]  # tool 2 may pass tool 1 (both profiled), not tool 0
    assert out[3] == pytest.approx(-0.2)  # pushing a profiled tool down is free
    assert capped_lift(base, lift, np.ones(4, bool)).tolist() == pytest.approx(lift.tolist())
    # the profiled tool above an unprofiled one may be lifted freely
    assert capped_lift(base, np.array([0.2, 0, 0, 0], np.float32), np.array([True, False, True, True]))[0] == pytest.approx(0.2)


def test_a_tool_passed_over_again_and_again_is_no_longer_held_above():
    """The guard protects tools nobody had the chance to use; one shown three times while the
    agent used another tool has been tried, and the lift may pass it (state survives a save)."""
    from registry.feedback.events import FeedbackEvent
    from registry.learning.usage import UsageConfig, UsageMemory

    q = unit(0, 1, 0)
    memory = UsageMemory(lambda text: q, UsageConfig())

    def event(i: int, shown: tuple[str, ...]) -> FeedbackEvent:
        return FeedbackEvent(
            shortlist_id=f"s{i}", registry="r", version=1, n_tools=3, k=len(shown), shown=shown,
            used=("t0",), success=True, calls=(), presented_exact=True, presented_equivalent=True,
            p_rand_exact=0.5, p_rand_equivalent=0.5, received=1000.0 + i, query=f"request {i}", caller=f"c{i}",
        )

    memory.observe(event(0, ("t0",)))
    memory.set_weight("r", 1.0)

    def order() -> list[int]:
        ids, _ = memory.rerank("r", q, ["other", "t0"], np.array([9, 0]), np.array([0.5, 0.45], np.float32),
                               np.array([0.0, 0.3], np.float32))
        return ids.tolist()

    assert order() == [9, 0]  # "other" never had the chance: held above
    for i in range(1, 3):
        memory.observe(event(i, ("other", "t0")))
    assert order() == [9, 0]  # passed over twice
    memory.observe(event(3, ("other", "t0")))
    assert order() == [0, 9]  # three times: tried, the lift may pass it
    restored = UsageMemory(lambda text: q, UsageConfig())
    restored.load_state("r", memory.state_bytes("r") or b"")
    restored.set_weight("r", 1.0)
    memory = restored
    assert order() == [0, 9]


def test_the_bound_resamples_requests_not_their_repeats():
    """BFCL's stream repeats each request about ten times: ten events of one lucky request and
    none worse among 64 requests is one request's evidence, not ten events'."""
    from registry.learning.profiles import request_bound

    groups = [f"request {i // 10}" for i in range(640)]
    gains = np.zeros(640)
    gains[:10] = 0.5  # every repeat of request 0 gains
    lower, changed = request_bound(gains, groups, 0.9)
    assert changed == 1 and lower == 0.0
    events_lower, _ = request_bound(gains, [f"event {i}" for i in range(640)], 0.9)
    assert events_lower > 0  # what a bootstrap over events said
    gains[:200] = 0.5  # 20 requests gain: a real effect
    lower, changed = request_bound(gains, groups, 0.9)
    assert changed == 20 and lower > 0.1
    assert request_bound(np.array([1.0, 1.0, 3.0]), ["a", "a", "b"], 0.5)[1] == 2


def test_a_weight_resting_on_too_few_requests_is_refused():
    """The same fit that ships with ``min_changed`` at most the requests it changes is refused
    with one more: however large the gain, it must rest on that many held-out requests."""
    from dataclasses import replace

    rng = np.random.default_rng(0)
    asked, described = _needs(rng, 20)
    q, used = _requests(rng, asked, 400)
    args = (q, used, [f"a{i % 10}" for i in range(400)], described)
    keys = [f"request {i}" for i in range(400)]
    weight, report = fit_weight(*args, ProfileConfig(), keys=keys)
    assert weight > 0 and report["changed_requests"] >= 5
    strict = replace(ProfileConfig(), min_changed=report["changed_requests"] + 1)
    weight, report = fit_weight(*args, strict, keys=keys)
    assert weight == 0.0 and "rests on" in report["reason"]
