"""Depth policy training: the DQN on synthetic episodes, the ONNX export, its manifest and
loading, the seed ensemble and the size gate. Self-contained: nothing from ../shared.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from registry.errors import ArtifactError, PolicySchemaMismatch
from registry.offline.episodes import Episode, save_episodes
from registry.serving.depth_policies import (
    DepthPolicy,
    FixedPolicy,
    OnnxDepthPolicy,
)
from registry.serving.features import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    depth_features,
)
from tests.depth_cases import descending, random_cases

F = len(FEATURE_NAMES)


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
    import torch  # noqa: F401  (the [test] extra installs [train]; a missing torch is a broken install)

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
    import torch  # noqa: F401  (the [test] extra installs [train]; a missing torch is a broken install)

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
    for scores, n_tools, max_k in random_cases(100):
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
    import torch  # noqa: F401  (the [test] extra installs [train]; a missing torch is a broken install)

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
    import onnxruntime as ort
    import torch  # noqa: F401  (the [test] extra installs [train]; a missing torch is a broken install)

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


def test_whole_registry_guarantee_is_in_the_served_policy(exported: Path) -> None:
    policy = OnnxDepthPolicy.from_dir(exported)
    scores = np.full(12, 0.2, dtype=np.float32)  # a flat list: the synthetic policy keeps walking
    assert policy.choose_depth(scores, 12, 20, bias=10.0) == 6
    policy.limit_depth = False  # the pre-guarantee behaviour, replayed only by benchmarks
    assert policy.choose_depth(scores, 12, 20, bias=10.0) == 12


def test_size_gate_serves_each_expert_in_its_range_and_exports(tmp_path: Path) -> None:
    import torch

    from registry.offline.export import export_onnx
    from registry.offline.train import QNetwork, SizeGatedQ, TrainedPolicy
    from registry.serving.depth_policies import policy_depth_limit

    torch.manual_seed(0)
    small, large = QNetwork(F, (8,)), QNetwork(F, (8,))
    gate = SizeGatedQ(small, large, 128, 199)
    scores = descending(np.random.default_rng(0).random(60))
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
