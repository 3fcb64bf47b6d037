"""Depth policy: the fixed, gap and threshold policies, the MDP rewards, the operating knob and
the registry-size guarantees. Self-contained: synthetic episodes only, nothing from ../shared.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from registry.bor import bor_max_bits
from registry.errors import ArtifactError
from registry.offline.env import CONTINUE, STOP, DepthEnv, build_replay, stop_rewards
from registry.offline.episodes import Episode, load_episodes, save_episodes
from registry.serving.depth_policies import (
    DepthPolicy,
    FixedPolicy,
    GapPolicy,
    ThresholdPolicy,
)
from registry.serving.features import depth_features
from tests.depth_cases import descending, random_cases

# ----------------------------------------------------------------------------- policies


@pytest.mark.parametrize(
    "policy", [FixedPolicy(1), FixedPolicy(5), FixedPolicy(100), GapPolicy(), ThresholdPolicy(0.4), ThresholdPolicy(9.0)]
)
def test_policy_bounds(policy: DepthPolicy) -> None:
    assert isinstance(policy, DepthPolicy)
    for scores, n_tools, max_k in random_cases():
        k = policy.choose_depth(scores, n_tools, max_k)
        assert isinstance(k, int)
        assert 1 <= k <= min(max_k, n_tools, len(scores))


def test_policies_with_nothing_to_show_return_zero() -> None:
    for policy in (FixedPolicy(3), GapPolicy(), ThresholdPolicy(0.1)):
        assert policy.choose_depth(np.array([], dtype=np.float32), 0, 10) == 0


def test_fixed_policy() -> None:
    s = np.array([0.9, 0.8, 0.7, 0.6])
    assert FixedPolicy(3).choose_depth(s, 100, 10) == 3
    assert FixedPolicy(3).choose_depth(s, 100, 2) == 2
    assert FixedPolicy(10).choose_depth(s, 100, 20) == 4
    assert FixedPolicy(10).choose_depth(s, 3, 20) == 3
    assert FixedPolicy(1).name == "fixed"
    with pytest.raises(ValueError):
        FixedPolicy(0)


def test_gap_policy_cuts_at_largest_drop() -> None:
    gap = GapPolicy()
    assert gap.name == "gap"
    assert gap.choose_depth(np.array([0.9, 0.88, 0.5, 0.49]), 100, 10) == 2
    assert gap.choose_depth(np.array([0.9, 0.5, 0.49, 0.48]), 100, 10) == 1
    # the score just past the cap counts: the cliff after the 3rd tool is seen with max_k=3
    assert gap.choose_depth(np.array([0.9, 0.89, 0.88, 0.2, 0.19]), 100, 3) == 3
    # ...but drops beyond the cap do not
    assert gap.choose_depth(np.array([0.9, 0.85, 0.84, 0.83, 0.1]), 100, 2) == 1
    assert gap.choose_depth(np.array([0.9, 0.89, 0.1]), 100, 1) == 1
    assert gap.choose_depth(np.array([0.5]), 100, 10) == 1
    assert gap.choose_depth(np.full(5, 0.5), 100, 10) == 1  # ties: shallowest cut


def test_threshold_policy() -> None:
    s = np.array([0.9, 0.5, 0.3, 0.2])
    assert ThresholdPolicy(0.4).choose_depth(s, 100, 10) == 2
    assert ThresholdPolicy(0.5).choose_depth(s, 100, 10) == 2
    assert ThresholdPolicy(0.95).choose_depth(s, 100, 10) == 1
    assert ThresholdPolicy(0.0).choose_depth(s, 100, 3) == 3
    assert ThresholdPolicy(0.0).name == "threshold"
    with pytest.raises(ValueError):
        ThresholdPolicy(math.nan)


# ----------------------------------------------------------------------------- episodes + env


def test_episode_roundtrip(tmp_path: Path) -> None:
    eps = [
        Episode(scores=descending(np.arange(60)), gold_ranks=np.array([0]), n_tools=370, query_id="a"),
        Episode(scores=np.array([0.5, 0.4, 0.1]), gold_ranks=np.array([2, 200]), n_tools=300, query_id="b"),
        Episode(scores=np.array([0.2]), gold_ranks=np.array([], dtype=np.int64), n_tools=1, query_id="c"),
    ]
    path = save_episodes(tmp_path / "eps.npz", eps, {"scorer": "dense", "n": 3})
    loaded, meta = load_episodes(path)
    assert meta == {"scorer": "dense", "n": 3}
    assert [e.query_id for e in loaded] == ["a", "b", "c"]
    for a, b in zip(eps, loaded, strict=True):
        np.testing.assert_array_equal(a.scores, b.scores)
        np.testing.assert_array_equal(a.gold_ranks, b.gold_ranks)
        assert a.n_tools == b.n_tools
    assert loaded[1].first_gold_rank == 2 and loaded[1].n_gold == 2
    assert loaded[2].first_gold_rank == 1 and loaded[2].n_gold == 0


def test_episode_validation_and_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Episode(scores=np.array([]), gold_ranks=np.array([0]), n_tools=5)
    with pytest.raises(ValueError):
        Episode(scores=np.array([0.1, 0.2]), gold_ranks=np.array([0]), n_tools=1)
    with pytest.raises(ValueError):
        Episode(scores=np.array([0.2]), gold_ranks=np.array([7]), n_tools=5)
    with pytest.raises(ArtifactError):
        load_episodes(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ArtifactError):
        load_episodes(tmp_path / "junk.npz")


def test_env_bor_rewards() -> None:
    ep = Episode(scores=descending(np.linspace(0, 1, 60)), gold_ranks=np.array([2]), n_tools=370)
    env = DepthEnv(ep, step_cost=0.01, gamma=0.95, max_depth=50)
    assert env.cap == 50
    state = env.reset()
    np.testing.assert_array_equal(state, depth_features(ep.scores, 370, 50)[0])
    # stopping before the gold tool (rank 2 -> needs k >= 3) earns nothing
    assert env.step(STOP) == (None, 0.0, True)
    env.reset()
    s2, r, done = env.step(CONTINUE)
    assert r == pytest.approx(-0.01) and not done
    np.testing.assert_array_equal(s2, env.features[1])
    env.step(CONTINUE)
    _, r, done = env.step(STOP)
    assert done and r == pytest.approx(math.log2(370 / 3))
    with pytest.raises(RuntimeError):
        env.step(STOP)
    np.testing.assert_allclose(env.stop_rewards[:2], 0.0)
    np.testing.assert_allclose(env.stop_rewards[2:], np.log2(370 / np.arange(3, 51)), rtol=1e-12)
    assert env.optimal_depth() == 3
    g = env.returns()[2]
    assert g == pytest.approx(-0.01 * (1 + 0.95) + 0.95**2 * math.log2(370 / 3))


def test_env_rewards_use_the_number_of_relevant_tools() -> None:
    ep = Episode(scores=descending(np.linspace(0, 1, 10)), gold_ranks=np.array([0, 4, 30]), n_tools=40)
    r = stop_rewards(ep, reward="bor", max_depth=10)
    np.testing.assert_allclose(r, [bor_max_bits(40, 3, k) for k in range(1, 11)], rtol=1e-12)


def test_env_f1_reward_and_cap() -> None:
    ep = Episode(scores=np.array([0.9, 0.8, 0.7, 0.6]), gold_ranks=np.array([1]), n_tools=4)
    env = DepthEnv(ep, reward="f1", max_depth=50)
    assert env.cap == 4
    np.testing.assert_allclose(env.stop_rewards, [0, 2 / 3, 2 / 4, 2 / 5])
    env.reset()
    for _ in range(3):
        env.step(CONTINUE)
    assert env.valid_actions() == (STOP,)
    with pytest.raises(ValueError):
        env.step(CONTINUE)
    _, r, _ = env.step(STOP)
    assert r == pytest.approx(0.4)
    with pytest.raises(ValueError):
        DepthEnv(ep, reward="nope")
    # custom reward functions plug in
    env = DepthEnv(ep, reward=lambda k, n, r: np.ones(len(k)) * 7.0, max_depth=2)
    np.testing.assert_allclose(env.stop_rewards, [0.0, 7.0])


def test_env_unreachable_gold_never_pays() -> None:
    ep = Episode(scores=np.linspace(1, 0, 20), gold_ranks=np.array([150]), n_tools=370)
    assert (stop_rewards(ep, max_depth=50) == 0).all()


def test_replay_covers_every_transition() -> None:
    eps = [
        Episode(scores=np.linspace(1, 0, 5), gold_ranks=np.array([0]), n_tools=100),
        Episode(scores=np.linspace(1, 0, 3), gold_ranks=np.array([1]), n_tools=3),
    ]
    rep = build_replay(eps, max_depth=4)
    assert rep.n_states == 4 + 3
    np.testing.assert_array_equal(rep.depth, [1, 2, 3, 4, 1, 2, 3])
    np.testing.assert_array_equal(rep.has_next, [1, 1, 1, 0, 1, 1, 0])
    np.testing.assert_array_equal(rep.next_is_cap, [0, 0, 1, 0, 0, 1, 0])
    np.testing.assert_allclose(rep.stop_reward[:4], np.log2(100 / np.arange(1, 5)), rtol=1e-6)
    np.testing.assert_allclose(rep.stop_reward[4:], [0, np.log2(3 / 2), 0.0], atol=1e-6)


# ----------------------------------------------------------------------------- operating knob


def test_first_stop_rule_and_its_bias() -> None:
    from registry.serving.depth_policies import first_stop

    adv = np.array([-0.3, 0.1, -0.2, 0.6, 0.2])  # Q_stop - Q_continue per depth
    q = np.stack([adv, np.zeros_like(adv)], axis=1)
    assert first_stop(q) == 2  # the served rule: first Q_stop >= Q_continue
    assert first_stop(q, 0.5) == 4
    assert first_stop(q, -0.25) == 2
    assert first_stop(q, -0.3) == 1
    assert first_stop(q, 0.7) == 5  # never worth stopping: the last depth
    assert first_stop(np.zeros((0, 2))) == 0


def test_bias_never_shortens_a_list_and_zero_is_the_trained_rule(bor_policy) -> None:
    """On the shipped policy and many real-looking score lists: depth is non-decreasing in the
    bias, bias 0 is the old rule, and the extremes give 1 tool and the cap."""
    policy = bor_policy
    biases = (-10.0, -1.0, -0.25, 0.0, 0.1, 0.25, 0.5, 1.0, 10.0)
    lengths = []
    for scores, n_tools, max_k in random_cases(200):
        ks = [policy.choose_depth(scores, n_tools, max_k, bias=b) for b in biases]
        assert ks == sorted(ks), (ks, n_tools, max_k)
        q = policy.q_values(scores, n_tools, max_k)
        stop = np.flatnonzero(q[:, 0] >= q[:, 1])
        assert ks[biases.index(0.0)] == (int(stop[0]) + 1 if stop.size else q.shape[0])
        assert ks[0] == 1 and ks[-1] == q.shape[0]
        lengths.append(ks)
    mean = np.mean(lengths, axis=0)
    assert mean[biases.index(-1.0)] < mean[biases.index(0.0)] < mean[biases.index(1.0)]


# ----------------------------------------------------------------------------- any registry size


def test_policy_depth_limit_is_half_the_registry_from_eight_tools() -> None:
    from registry.serving.depth_policies import policy_depth_limit

    assert [policy_depth_limit(n) for n in (0, 1, 5, 7)] == [0, 1, 5, 7]
    assert [policy_depth_limit(n) for n in (8, 9, 20, 50, 2479)] == [4, 4, 10, 25, 1239]
    for n in range(8, 300):
        assert policy_depth_limit(n) < n and math.log2(n / policy_depth_limit(n)) >= 1.0


def test_env_never_walks_past_half_a_registry() -> None:
    ep = Episode(scores=np.linspace(1, 0, 20), gold_ranks=np.array([15]), n_tools=20)
    env = DepthEnv(ep, max_depth=50)
    assert env.cap == 10
    assert (env.stop_rewards == 0).all()  # the gold tool at rank 16 is past the cap: never pays
    small = Episode(scores=np.linspace(1, 0, 5), gold_ranks=np.array([4]), n_tools=5)
    assert DepthEnv(small, max_depth=50).cap == 5


@pytest.mark.parametrize("n_tools", [8, 20, 50])
def test_shipped_policy_never_answers_with_the_whole_registry(bor_policy, n_tools: int) -> None:
    """Flat, noisy and cliff-shaped score lists at every operating-knob value, even the extreme
    +10 bits: at most half of a registry of 8+ tools."""
    rng = np.random.default_rng(n_tools)
    cases = [np.full(n_tools, 0.3, dtype=np.float32), descending(np.linspace(0.9, 0.1, n_tools))]
    for _ in range(100):
        s = rng.normal(0.35, rng.uniform(0.001, 0.2), n_tools)
        if rng.random() < 0.3:
            s[: rng.integers(1, n_tools)] += rng.uniform(0.0, 0.5)
        cases.append(descending(s))
    for scores in cases:
        for bias in (0.0, 1.0, 10.0):
            for max_k in (20, 50):
                k = bor_policy.choose_depth(scores, n_tools, max_k, bias=bias)
                assert 1 <= k <= n_tools // 2, (k, n_tools, bias)


def test_bor_reward_floor_prices_small_registries_like_larger_ones() -> None:
    from registry.offline.env import bor_reward, bor_reward_floor

    k = np.arange(1, 5)
    floored = bor_reward_floor(64)
    np.testing.assert_allclose(floored(k, 8, 1), np.log2(64 / k), rtol=1e-12)
    np.testing.assert_allclose(floored(k, 370, 2), bor_reward(k, 370, 2), rtol=1e-12)  # unchanged above
    # plain BoR on 8 tools: 1 tool found 70% of the time beats 3 tools found always; floored, it does not
    assert 0.7 * bor_reward(k, 8, 1)[0] > 1.0 * bor_reward(k, 8, 1)[2]
    assert 0.7 * floored(k, 8, 1)[0] < 1.0 * floored(k, 8, 1)[2]
    with pytest.raises(ValueError):
        bor_reward_floor(0)
