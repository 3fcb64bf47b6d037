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
    profiles = build_profiles(q[None, :], [[0]], ["a"], tools, ProfileConfig(n0=2.0))
    assert profiles.shrink.tolist() == pytest.approx([1 / 3])
    lift = profile_lift(profiles, q, np.array([1, 0]), ProfileConfig(n0=2.0))
    assert lift.tolist() == pytest.approx([0.0, 1 / 3])  # a_t * (cos(q, c_t) - cos(q, d_t)) = 1/3 * (1 - 0)
    probe = unit(1, 1, 0)  # half-way between the description and how users asked
    assert profile_lift(profiles, probe, np.array([0]), ProfileConfig())[0] == pytest.approx(0.0, abs=1e-6)
    # only the first `candidates` can be lifted
    assert profile_lift(profiles, q, np.array([1, 0]), ProfileConfig(candidates=1)).tolist() == [0.0, 0.0]


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
