"""Depth policy: features, policies, MDP rewards, DQN training, ONNX export and loading.

Self-contained: synthetic episodes only, nothing from ../shared.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from registry.bor import bor_max_bits
from registry.errors import ArtifactError, PolicySchemaMismatch
from registry.offline.env import CONTINUE, STOP, DepthEnv, build_replay, stop_rewards
from registry.offline.episodes import Episode, load_episodes, save_episodes
from registry.serving.depth_policies import (
    DepthPolicy,
    FixedPolicy,
    GapPolicy,
    OnnxDepthPolicy,
    ThresholdPolicy,
)
from registry.serving.features import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    FEATURE_WINDOW,
    depth_features,
)

ROOT = Path(__file__).resolve().parent.parent
F = len(FEATURE_NAMES)
COL = {name: i for i, name in enumerate(FEATURE_NAMES)}


def _desc(x: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(x, dtype=np.float32))[::-1].copy()


# ----------------------------------------------------------------------------- features


def test_feature_names_are_unique_and_versioned() -> None:
    assert len(set(FEATURE_NAMES)) == F
    assert isinstance(FEATURE_SCHEMA_VERSION, str) and FEATURE_SCHEMA_VERSION
    assert FEATURE_WINDOW == 51


@pytest.mark.parametrize(
    ("length", "n_tools", "max_depth", "expected_d"),
    [(60, 370, 20, 20), (60, 370, 100, 60), (5, 370, 20, 5), (60, 3, 20, 3), (1, 1, 20, 1), (1, 370, 1, 1)],
)
def test_feature_shape(length: int, n_tools: int, max_depth: int, expected_d: int) -> None:
    scores = _desc(np.random.default_rng(0).random(length))
    out = depth_features(scores, n_tools, max_depth)
    assert out.shape == (expected_d, F)
    assert out.dtype == np.float32
    assert np.isfinite(out).all()


def test_feature_rows_follow_the_walk() -> None:
    scores = np.array([0.9, 0.5, 0.49, 0.3, 0.29], dtype=np.float32)
    out = depth_features(scores, 370, 5)
    np.testing.assert_array_equal(out[:, COL["k"]], [1, 2, 3, 4, 5])
    np.testing.assert_allclose(out[:, COL["cur_score"]], scores)
    np.testing.assert_allclose(out[:, COL["top_score"]], 0.9)
    np.testing.assert_allclose(out[:, COL["gap_top_cur"]], 0.9 - scores, atol=1e-6)
    rng = 0.9 - 0.29
    np.testing.assert_allclose(out[:, COL["top_drop_rel"]], 0.4 / rng, rtol=1e-5)
    # next-gap: 0.4, 0.01, 0.19, 0.01, then 0 past the end of the list
    np.testing.assert_allclose(out[:, COL["gap_next_rel"]], np.array([0.4, 0.01, 0.19, 0.01, 0.0]) / rng, atol=1e-6)
    np.testing.assert_allclose(out[:, COL["max_drop_seen_rel"]], np.array([0, 0.4, 0.4, 0.4, 0.4]) / rng, atol=1e-6)
    np.testing.assert_allclose(out[:, COL["gap_next_vs_max_drop"]][0], 1.0, rtol=1e-6)
    np.testing.assert_allclose(out[:, COL["log2_n"]], math.log2(370), rtol=1e-6)
    np.testing.assert_allclose(out[:, COL["bor_ceiling"]], np.log2(370 / np.arange(1, 6)), rtol=1e-6)
    z = (scores - scores.mean()) / scores.std()
    np.testing.assert_allclose(out[:, COL["z_cur"]], z, rtol=1e-4)


def test_feature_row_prefix_does_not_depend_on_max_depth() -> None:
    scores = _desc(np.random.default_rng(1).random(60))
    full = depth_features(scores, 370, 50)
    np.testing.assert_array_equal(depth_features(scores, 370, 7), full[:7])


def test_window_limits_the_statistics() -> None:
    rng = np.random.default_rng(2)
    head = _desc(rng.random(FEATURE_WINDOW) + 1.0)
    a = np.concatenate([head, np.full(20, -5.0, np.float32)])
    b = np.concatenate([head, np.full(20, -50.0, np.float32)])
    np.testing.assert_array_equal(depth_features(a, 1000, 20), depth_features(b, 1000, 20))


@pytest.mark.parametrize(
    "scores",
    [
        np.array([0.5]),
        np.array([0.0]),
        np.full(60, 0.3),
        np.array([0.7, 0.7, 0.7, 0.1]),
        np.array([1e-30, 1e-31, 0.0]),
        np.array([1e30, -1e30]),
        np.array([np.nan, 0.5, 0.4]),
        np.array([np.inf, 0.5, -np.inf]),
        np.array([np.nan, np.nan]),
    ],
)
def test_features_are_always_finite(scores: np.ndarray) -> None:
    for n_tools in (len(scores), 1000):
        out = depth_features(scores, n_tools, 50)
        assert out.shape == (min(len(scores), n_tools, 50), F)
        assert np.isfinite(out).all()


def test_constant_scores_give_zero_ratios() -> None:
    out = depth_features(np.full(10, 0.42), 10, 10)
    for name in ("gap_top_cur_rel", "gap_next_rel", "z_top", "z_cur", "max_drop_seen_rel", "top_drop_rel"):
        assert (out[:, COL[name]] == 0).all(), name


@pytest.mark.parametrize(("n_tools", "max_depth"), [(0, 5), (5, 0)])
def test_feature_argument_errors(n_tools: int, max_depth: int) -> None:
    with pytest.raises(ValueError):
        depth_features(np.array([0.5, 0.4]), n_tools, max_depth)
    with pytest.raises(ValueError):
        depth_features(np.array([]), 5, 5)


def test_serving_modules_do_not_import_torch_or_scipy() -> None:
    code = (
        "import sys\n"
        "import registry.bor, registry.serving.features, registry.serving.depth_policies\n"
        "import registry.offline.episodes, registry.offline.env\n"
        "bad = [m for m in ('torch', 'scipy') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ----------------------------------------------------------------------------- policies


def _random_cases(n: int = 300) -> list[tuple[np.ndarray, int, int]]:
    rng = np.random.default_rng(3)
    cases = []
    for _ in range(n):
        length = int(rng.integers(1, 70))
        n_tools = int(rng.integers(length, length + 500))
        if rng.random() < 0.2:
            n_tools = length
        max_k = int(rng.integers(1, 60))
        scores = _desc(rng.normal(0.4, 0.2, length))
        if rng.random() < 0.1:
            scores[:] = scores[0]
        cases.append((scores, n_tools, max_k))
    return cases


@pytest.mark.parametrize(
    "policy", [FixedPolicy(1), FixedPolicy(5), FixedPolicy(100), GapPolicy(), ThresholdPolicy(0.4), ThresholdPolicy(9.0)]
)
def test_policy_bounds(policy: DepthPolicy) -> None:
    assert isinstance(policy, DepthPolicy)
    for scores, n_tools, max_k in _random_cases():
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
        Episode(scores=_desc(np.arange(60)), gold_ranks=np.array([0]), n_tools=370, query_id="a"),
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
    ep = Episode(scores=_desc(np.linspace(0, 1, 60)), gold_ranks=np.array([2]), n_tools=370)
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
    ep = Episode(scores=_desc(np.linspace(0, 1, 10)), gold_ranks=np.array([0, 4, 30]), n_tools=40)
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


# ----------------------------------------------------------------------------- DQN + export

N_SYNTH = 100


def _synthetic(n: int, seed: int) -> list[Episode]:
    """Half "clear" queries (a big top gap, gold at rank 0), half "muddled" ones (a flat head,
    gold at rank 3). The right depth is 1 or 4, and it can be read off the scores."""
    rng = np.random.default_rng(seed)
    eps = []
    for i in range(n):
        tail = 0.45 - rng.uniform(0.0, 0.3, 36)
        if i % 2 == 0:
            head = np.array([0.8 + rng.normal(0, 0.02)])
            gold = 0
        else:
            head = 0.58 + rng.normal(0, 0.01) - np.cumsum(rng.uniform(0.002, 0.008, 8))
            gold = 3
        scores = np.sort(np.concatenate([head, tail]))[::-1].astype(np.float32)
        eps.append(Episode(scores=scores, gold_ranks=np.array([gold]), n_tools=N_SYNTH, query_id=f"q{i}"))
    return eps


@pytest.fixture(scope="module")
def trained():
    pytest.importorskip("torch")
    from registry.offline.train import train_dqn

    return train_dqn(_synthetic(200, seed=0), seed=0, steps=1500, batch_size=256, max_depth=20)


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from registry.offline.export import export_onnx

    out = tmp_path_factory.mktemp("policy")
    return export_onnx(
        trained,
        out,
        training_data={"scorer": "synthetic", "n_train": 200},
        metrics={"found": 1.0, "bits": math.inf},
        seed=0,
    )


def test_dqn_learns_adaptive_depth_and_beats_fixed_k(trained) -> None:
    from registry.offline.train import compare_with_fixed, evaluate_policy

    held_out = _synthetic(100, seed=1)
    cmp = compare_with_fixed(trained.choose_depth, held_out, max_depth=20)
    pol = cmp["policy"]
    # oracle: depth 1 on clear queries, 4 on muddled ones -> found 1.0 at mean K 2.5,
    # where fixed depth finds only the clear half
    assert pol["found"] >= 0.95
    assert 2.0 <= pol["mean_k"] <= 3.2
    assert cmp["beats_fixed"]
    assert pol["found"] >= cmp["fixed_found_at_mean_k"] + 0.3
    clear = [e for e in held_out if e.first_gold_rank == 0]
    muddled = [e for e in held_out if e.first_gold_rank == 3]
    assert evaluate_policy(trained.choose_depth, clear, 20)["mean_k"] < 1.5
    assert evaluate_policy(trained.choose_depth, muddled, 20)["mean_k"] >= 4
    assert cmp["fixed"]["1"]["found"] == pytest.approx(0.5)
    assert cmp["fixed"]["5"]["found"] == pytest.approx(1.0)


def test_evaluate_policy_bits() -> None:
    from registry.offline.metrics import fixed_curve, fixed_found_at
    from registry.offline.train import evaluate_policy

    eps = [
        Episode(scores=np.linspace(1, 0, 10), gold_ranks=np.array([0]), n_tools=200),
        Episode(scores=np.linspace(1, 0, 10), gold_ranks=np.array([1]), n_tools=200),
    ]
    m = evaluate_policy(FixedPolicy(1).choose_depth, eps, 10)
    assert m["found"] == 0.5 and m["mean_k"] == 1.0 and m["k_std"] == 0.0
    assert m["mean_p_rand"] == pytest.approx(1 / 200)
    assert m["bor_bits"] == pytest.approx(math.log2(0.5 * 200))
    assert fixed_found_at(fixed_curve(eps, 10), 1.5) == pytest.approx(0.75)


def test_training_is_deterministic() -> None:
    pytest.importorskip("torch")
    from registry.offline.train import train_dqn

    eps = _synthetic(20, seed=3)
    a = train_dqn(eps, seed=7, steps=50, batch_size=64, max_depth=10)
    b = train_dqn(eps, seed=7, steps=50, batch_size=64, max_depth=10)
    x = depth_features(eps[1].scores, N_SYNTH, 10)
    np.testing.assert_array_equal(a.q_values(x), b.q_values(x))


def test_onnx_matches_pytorch(trained, exported: Path) -> None:
    import onnxruntime as ort

    manifest = json.loads((exported / "manifest.json").read_text())
    sess = ort.InferenceSession(str(exported / manifest["onnx_file"]), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    real = np.concatenate([depth_features(e.scores, e.n_tools, 20) for e in _synthetic(40, seed=9)])
    mean = trained.network.mean.numpy()
    std = 1.0 / trained.network.inv_std.numpy()
    noise = (mean + 3.0 * std * rng.standard_normal((1200, F))).astype(np.float32)
    x = np.concatenate([real, noise])
    assert x.shape[0] >= 1000
    (got,) = sess.run(["q_values"], {"features": x})
    want = trained.q_values(x)
    assert got.shape == (x.shape[0], 2)
    assert float(np.max(np.abs(got - want))) < 1e-5


def test_policy_clamps_inputs_to_the_training_range(trained, exported: Path) -> None:
    """A registry unlike the training data (here 10^6 tools, absurd scores) is read as the
    nearest training case, not extrapolated; torch and ONNX agree."""
    import onnxruntime as ort
    import torch

    manifest = json.loads((exported / "manifest.json").read_text())
    ranges = manifest["feature_range"]
    assert list(ranges) == list(FEATURE_NAMES)
    low = np.array([ranges[f][0] for f in FEATURE_NAMES], dtype=np.float32)
    high = np.array([ranges[f][1] for f in FEATURE_NAMES], dtype=np.float32)
    seen = np.concatenate([depth_features(e.scores, e.n_tools, 20) for e in _synthetic(200, seed=0)])
    np.testing.assert_allclose(low, seen.min(axis=0), atol=1e-6)
    np.testing.assert_allclose(high, seen.max(axis=0), atol=1e-6)
    n_idx = FEATURE_NAMES.index("log2_n")
    assert low[n_idx] == high[n_idx] == pytest.approx(math.log2(N_SYNTH))  # one registry size

    far = np.concatenate([depth_features(e.scores * 40.0, 10**6, 20) for e in _synthetic(20, seed=4)])
    assert (far[:, n_idx] > high[n_idx] + 10).all()
    clipped = np.clip(far, low, high)
    np.testing.assert_array_equal(trained.q_values(far), trained.q_values(clipped))
    sess = ort.InferenceSession(str(exported / manifest["onnx_file"]), providers=["CPUExecutionProvider"])
    (got,) = sess.run(["q_values"], {"features": far})
    assert float(np.max(np.abs(got - trained.q_values(clipped)))) < 1e-5
    # the clamp is not a no-op: the network standardises before its own +-10 sigma clip,
    # so without the range clamp these rows would give other Q-values
    unclamped = copy.deepcopy(trained.network)
    unclamped.low.fill_(-np.inf)
    unclamped.high.fill_(np.inf)
    with torch.no_grad():
        raw = unclamped(torch.as_tensor(far)).numpy()
    assert float(np.max(np.abs(raw - trained.q_values(far)))) > 1e-3


def test_manifest_contents(exported: Path) -> None:
    manifest = json.loads((exported / "manifest.json").read_text())
    for key in (
        "name", "feature_schema_version", "feature_names", "onnx_file", "sha256", "opset", "reward",
        "step_cost", "gamma", "max_depth", "seed", "scorer", "training_data", "metrics", "created",
    ):
        assert key in manifest, key
    assert manifest["name"] == "bor"
    assert manifest["feature_schema_version"] == FEATURE_SCHEMA_VERSION
    assert tuple(manifest["feature_names"]) == FEATURE_NAMES
    assert manifest["opset"] == 17
    assert manifest["max_depth"] == 20
    assert manifest["scorer"] == "synthetic"
    assert manifest["metrics"]["bits"] == "inf"  # non-finite floats are stored as strings
    assert not list(exported.glob(".*.tmp"))


def test_onnx_policy_serves_like_the_trained_policy(trained, exported: Path) -> None:
    policy = OnnxDepthPolicy.from_dir(exported)
    assert isinstance(policy, DepthPolicy)
    assert policy.name == "bor"
    assert policy.manifest["sha256"]
    for ep in _synthetic(60, seed=11):
        for max_k in (1, 3, 20, 100):
            k = policy.choose_depth(ep.scores, ep.n_tools, max_k)
            assert 1 <= k <= min(max_k, ep.n_tools, len(ep.scores))
            assert k == trained.choose_depth(ep.scores, ep.n_tools, max_k)
    for scores, n_tools, max_k in _random_cases(100):
        k = policy.choose_depth(scores, n_tools, max_k)
        assert 1 <= k <= min(max_k, n_tools, len(scores))
    assert policy.choose_depth(np.array([], dtype=np.float32), 0, 10) == 0


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_manifest(directory: Path, **changes: object) -> None:
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def test_onnx_policy_refuses_other_feature_schema(exported: Path, tmp_path: Path) -> None:
    d = _copy(exported, tmp_path / "schema")
    _edit_manifest(d, feature_schema_version="0")
    with pytest.raises(PolicySchemaMismatch):
        OnnxDepthPolicy.from_dir(d)
    d = _copy(exported, tmp_path / "names")
    _edit_manifest(d, feature_names=list(reversed(FEATURE_NAMES)))
    with pytest.raises(PolicySchemaMismatch):
        OnnxDepthPolicy.from_dir(d)


def test_onnx_policy_refuses_tampered_artifacts(exported: Path, tmp_path: Path) -> None:
    d = _copy(exported, tmp_path / "sha")
    _edit_manifest(d, sha256="0" * 64)
    with pytest.raises(ArtifactError):
        OnnxDepthPolicy.from_dir(d)
    d = _copy(exported, tmp_path / "bytes")
    onnx_file = d / "policy.onnx"
    onnx_file.write_bytes(onnx_file.read_bytes() + b"\0")
    with pytest.raises(ArtifactError):
        OnnxDepthPolicy.from_dir(d)
    d = _copy(exported, tmp_path / "missing")
    (d / "policy.onnx").unlink()
    with pytest.raises(ArtifactError):
        OnnxDepthPolicy.from_dir(d)
    with pytest.raises(ArtifactError):
        OnnxDepthPolicy.from_dir(tmp_path / "nowhere")
    d = _copy(exported, tmp_path / "escape")
    _edit_manifest(d, onnx_file="../sha/policy.onnx")
    with pytest.raises(ArtifactError):
        OnnxDepthPolicy.from_dir(d)


def test_cli_trains_and_exports(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from registry.offline.train_cli import main

    save_episodes(tmp_path / "a.npz", _synthetic(60, seed=4), {"scorer": "synthetic"})
    save_episodes(tmp_path / "b.npz", _synthetic(40, seed=5), {"scorer": "synthetic"})
    rc = main(
        [
            "--episodes", str(tmp_path / "a.npz"), str(tmp_path / "b.npz"),
            "--holdout-fraction", "0.3", "--seed", "0", "--steps", "200", "--max-depth", "20",
            "--out", str(tmp_path / "models"),
        ]
    )
    assert rc == 0
    policy = OnnxDepthPolicy.from_dir(tmp_path / "models")
    assert policy.manifest["scorer"] == "synthetic"
    assert set(policy.manifest["metrics"]["holdout"]) == {"a", "b", "all"}
    assert len(policy.manifest["training_data"]["files"]) == 2


def test_seed_ensemble_averages_members_and_exports(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import onnxruntime as ort

    from registry.offline.export import export_onnx
    from registry.offline.train import QEnsemble, train_dqn, train_ensemble

    eps = _synthetic(40, seed=6)
    ens = train_ensemble(eps, [1, 2], steps=60, batch_size=64, max_depth=10)
    assert isinstance(ens.network, QEnsemble) and ens.config["seeds"] == [1, 2]
    members = [train_dqn(eps, seed=s, steps=60, batch_size=64, max_depth=10) for s in (1, 2)]
    x = np.concatenate([depth_features(e.scores, e.n_tools, 10) for e in eps])
    np.testing.assert_allclose(
        ens.q_values(x), (members[0].q_values(x) + members[1].q_values(x)) / 2, atol=1e-6
    )
    out = export_onnx(ens, tmp_path / "ens", training_data={}, metrics={}, seed=1)
    sess = ort.InferenceSession(str(out / "policy.onnx"), providers=["CPUExecutionProvider"])
    (got,) = sess.run(["q_values"], {"features": x})
    assert float(np.max(np.abs(got - ens.q_values(x)))) < 1e-5
    policy = OnnxDepthPolicy.from_dir(out)
    for ep in eps:
        assert policy.choose_depth(ep.scores, ep.n_tools, 10) == ens.choose_depth(ep.scores, ep.n_tools, 10)


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
    for scores, n_tools, max_k in _random_cases(200):
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
    cases = [np.full(n_tools, 0.3, dtype=np.float32), _desc(np.linspace(0.9, 0.1, n_tools))]
    for _ in range(100):
        s = rng.normal(0.35, rng.uniform(0.001, 0.2), n_tools)
        if rng.random() < 0.3:
            s[: rng.integers(1, n_tools)] += rng.uniform(0.0, 0.5)
        cases.append(_desc(s))
    for scores in cases:
        for bias in (0.0, 1.0, 10.0):
            for max_k in (20, 50):
                k = bor_policy.choose_depth(scores, n_tools, max_k, bias=bias)
                assert 1 <= k <= n_tools // 2, (k, n_tools, bias)


def test_whole_registry_guarantee_is_in_the_served_policy(exported: Path) -> None:
    policy = OnnxDepthPolicy.from_dir(exported)
    scores = np.full(12, 0.2, dtype=np.float32)  # a flat list: the synthetic policy keeps walking
    assert policy.choose_depth(scores, 12, 20, bias=10.0) == 6
    policy.limit_depth = False  # the pre-guarantee behaviour, replayed only by benchmarks
    assert policy.choose_depth(scores, 12, 20, bias=10.0) == 12


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



def test_size_gate_serves_each_expert_in_its_range_and_exports(tmp_path: Path) -> None:
    import torch

    from registry.offline.export import export_onnx
    from registry.offline.train import QNetwork, SizeGatedQ, TrainedPolicy
    from registry.serving.depth_policies import policy_depth_limit

    torch.manual_seed(0)
    small, large = QNetwork(F, (8,)), QNetwork(F, (8,))
    gate = SizeGatedQ(small, large, 128, 199)
    scores = _desc(np.random.default_rng(0).random(60))
    x = {n: torch.from_numpy(depth_features(scores, n, 20)) for n in (8, 128, 160, 199, 2479)}
    with torch.no_grad():
        torch.testing.assert_close(gate(x[8]), small(x[8]))
        torch.testing.assert_close(gate(x[128]), small(x[128]))
        torch.testing.assert_close(gate(x[199]), large(x[199]))
        torch.testing.assert_close(gate(x[2479]), large(x[2479]))
        w = (math.log2(199) - math.log2(160)) / (math.log2(199) - math.log2(128))
        torch.testing.assert_close(gate(x[160]), w * small(x[160]) + (1 - w) * large(x[160]))
    with pytest.raises(ValueError):
        SizeGatedQ(small, large, 200, 100)
    trained = TrainedPolicy(network=gate, config={"max_depth": 20, "hidden": [8]})
    out = export_onnx(trained, tmp_path / "gated", training_data={}, metrics={}, seed=0)
    policy = OnnxDepthPolicy.from_dir(out)
    for n in (8, 160, 2479):
        q = policy.q_values(scores, n, 20)  # 4 depths on 8 tools (policy_depth_limit), else 20
        assert q.shape == (min(20, policy_depth_limit(n)), 2)
        np.testing.assert_allclose(q, trained.q_values(x[n].numpy())[: len(q)], atol=1e-5)
