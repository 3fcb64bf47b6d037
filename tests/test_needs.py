"""Needs-aware depth (feature schema 2): the reward maths against scipy, the request features,
the reward and replay of multi-tool episodes, and ONNX parity of an exported schema-2 policy."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import hypergeom

from registry.bor import needs_bits_curve
from registry.offline.env import NeedsReward, build_replay, stop_rewards
from registry.offline.episodes import Episode
from registry.serving.features import FEATURE_NAMES
from registry.serving.needs import (
    NEEDS_FEATURE_NAMES,
    NEEDS_INPUT_NAMES,
    NEUTRAL_SIGNALS,
    REQUEST_FEATURE_NAMES,
    NeedsModel,
    needs_features,
    needs_inputs,
    request_signals,
)


def _scipy_needs(n: int, r: int, hits: list[int]) -> list[float]:
    """The needs reward from scipy's hypergeometric law: chance recall is the mean of
    hypergeom(N, R, K) over R; chance all-needed is its pmf at R."""
    out = []
    for k, h in enumerate(hits, start=1):
        dist = hypergeom(n, r, k)
        chance_recall = dist.mean() / r
        value = 0.5 * (h / r) * -math.log2(chance_recall)
        if h == r:
            value += 0.5 * -math.log2(dist.pmf(r)) / r
        out.append(value)
    return out


@pytest.mark.parametrize(
    ("n", "r", "hits"),
    [(50, 1, [0, 1, 1, 1]), (50, 3, [1, 1, 2, 3, 3]), (2479, 2, [0, 1, 1, 2]), (8, 4, [1, 2, 3, 4]),
     (1024, 5, [1, 2, 2, 3, 4, 5, 5, 5])],
)
def test_needs_bits_match_scipy_hypergeom(n: int, r: int, hits: list[int]) -> None:
    got = needs_bits_curve(n, r, np.array(hits))
    assert got == pytest.approx(_scipy_needs(n, r, hits), rel=1e-9, abs=1e-12)


def test_needs_bits_equal_bor_for_one_needed_tool() -> None:
    got = needs_bits_curve(370, 1, np.array([1, 1, 1]))
    assert got == pytest.approx([math.log2(370 / k) for k in (1, 2, 3)], rel=1e-12)
    with pytest.raises(ValueError):
        needs_bits_curve(10, 2, np.array([3]))


def test_needs_reward_pays_for_every_needed_tool() -> None:
    # gold at ranks 0 and 3: a 1-list holds half the task, a 4-list all of it
    ep = Episode(scores=np.linspace(1, 0, 20), gold_ranks=np.array([0, 3]), n_tools=1000)
    r = stop_rewards(ep, reward=NeedsReward(), max_depth=10)
    bor = stop_rewards(ep, reward="bor", max_depth=10)
    assert r[3] > r[2] and r[3] > r[0]  # completing the task pays more than stopping at the first
    assert bor[0] > bor[3]  # the any-found reward prefers the first tool alone
    single = Episode(scores=np.linspace(1, 0, 20), gold_ranks=np.array([2]), n_tools=1000)
    assert stop_rewards(single, reward="needs") == pytest.approx(stop_rewards(single, reward="bor"))


def test_request_signals_count_intents_and_length() -> None:
    one = request_signals("what's the weather in Paris")
    two = request_signals("read notes.md and then email it to Bob, then post it to #general")
    assert one[0] == 1 and one[1] == 0
    assert two[0] >= 2 and two[1] >= 1
    assert two[2] > one[2] and two[3] > one[3]
    assert request_signals("").tolist() == pytest.approx(NEUTRAL_SIGNALS.tolist())


def test_needs_model_fits_the_number_of_needs_and_round_trips() -> None:
    rng = np.random.default_rng(0)
    rows, needs = [], []
    for _ in range(300):
        n_int = int(rng.integers(1, 4))
        sig = np.array([n_int, n_int - 1, 3.0, float(n_int)], dtype=np.float32)
        rows.append(needs_inputs(sig, np.sort(rng.random(60))[::-1], np.zeros(len(FEATURE_NAMES))))
        needs.append(n_int)
    model = NeedsModel.fit(rows, needs)
    est = [model.estimate(r) for r in rows]
    assert np.corrcoef(est, np.log2(needs))[0, 1] > 0.9
    assert NeedsModel.from_json(json.loads(json.dumps(model.to_json()))) == model
    with pytest.raises(ValueError):
        NeedsModel.from_json({"inputs": ["bias"], "coef": [1.0]})
    with pytest.raises(ValueError):
        NeedsModel((math.nan,) * len(NEEDS_INPUT_NAMES))


def test_needs_features_append_the_request_columns() -> None:
    model = NeedsModel(tuple([0.5] + [0.0] * (len(NEEDS_INPUT_NAMES) - 1)))
    scores = np.linspace(1.0, 0.0, 60)
    sig = request_signals("find the file and then delete it")
    out = needs_features(scores, 500, 12, sig, model)
    assert out.shape == (12, len(NEEDS_FEATURE_NAMES))
    assert out.dtype == np.float32 and np.isfinite(out).all()
    extra = out[:, len(FEATURE_NAMES):]
    assert (extra == extra[0]).all()  # the same on every depth
    col = dict(zip(REQUEST_FEATURE_NAMES, extra[0]))
    assert col["n_intents"] == sig[0] and col["needs_estimate"] == pytest.approx(0.5)
    assert needs_features(scores, 500, 12, None, model)[0, len(FEATURE_NAMES)] == 1.0  # neutral


def test_replay_with_needs_features_and_reward() -> None:
    model = NeedsModel(tuple([0.0] * len(NEEDS_INPUT_NAMES)))
    eps = [
        Episode(np.linspace(1, 0, 30), np.array([0, 2]), 200, "a", request_signals("x and then y")),
        Episode(np.linspace(1, 0, 30), np.array([1]), 200, "b", request_signals("x")),
    ]
    replay = build_replay(
        eps, reward="needs", max_depth=10,
        featurize=lambda e, d: needs_features(e.scores, e.n_tools, d, e.signals, model),
    )
    assert replay.states.shape == (20, len(NEEDS_FEATURE_NAMES))
    first = replay.stop_reward[:10]
    assert first[2] > first[0] > 0  # all needed at depth 3 beats the first tool alone


def test_a_schema2_policy_exports_to_onnx_and_serves_the_same_depths(tmp_path) -> None:
    import torch

    from registry.offline.export import export_onnx
    from registry.offline.train import train_dqn
    from registry.serving.depth_policies import OnnxDepthPolicy
    from registry.serving.needs import NEEDS_SCHEMA_VERSION

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    texts = ["send the report", "read a.txt and then write b.txt and email it", "list my files"]
    eps = []
    for i in range(60):
        text = texts[i % 3]
        n_gold = 3 if i % 3 == 1 else 1
        scores = np.sort(rng.random(60))[::-1]
        gold = np.sort(rng.choice(6, size=n_gold, replace=False))
        eps.append(Episode(scores, gold, 300, f"q{i}", request_signals(text)))
    model = NeedsModel.fit([needs_inputs(e.signals, e.scores, np.zeros(len(FEATURE_NAMES))) for e in eps],
                           [e.n_gold for e in eps])
    trained = train_dqn(
        eps, reward="needs", steps=60, batch_size=64, hidden=(8,), max_depth=20,
        featurize=lambda e, d: needs_features(e.scores, e.n_tools, d, e.signals, model),
    )
    trained.needs_model = model
    trained.feature_names = NEEDS_FEATURE_NAMES
    trained.feature_schema_version = NEEDS_SCHEMA_VERSION
    out = export_onnx(trained, tmp_path / "p", training_data={}, metrics={}, seed=0, scorer="hybrid")
    served = OnnxDepthPolicy.from_dir(out)
    assert served.needs_model == model
    for e in eps[:9]:
        d = min(20, e.n_tools // 2)
        want = trained.q_values(needs_features(e.scores, e.n_tools, d, e.signals, model))
        got = served.q_values(e.scores, e.n_tools, 20, signals=e.signals)
        assert np.abs(got - want).max() < 1e-4
        assert served.choose_depth(e.scores, e.n_tools, 20, signals=e.signals) == trained.choose_depth(
            e.scores, e.n_tools, 20, signals=e.signals
        )
    # a manifest whose needs model is missing is refused, naming the file
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["needs_model"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    from registry.errors import ArtifactError

    with pytest.raises(ArtifactError, match=r"manifest\.json"):
        OnnxDepthPolicy.from_dir(out)
