"""Depth policy state features: shape, the walk, the window, finiteness (synthetic scores only)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from registry.serving.features import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    FEATURE_WINDOW,
    depth_features,
)
from tests.depth_cases import descending

ROOT = Path(__file__).resolve().parent.parent
F = len(FEATURE_NAMES)
COL = {name: i for i, name in enumerate(FEATURE_NAMES)}


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
    scores = descending(np.random.default_rng(0).random(length))
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
    scores = descending(np.random.default_rng(1).random(60))
    full = depth_features(scores, 370, 50)
    np.testing.assert_array_equal(depth_features(scores, 370, 7), full[:7])


def test_window_limits_the_statistics() -> None:
    rng = np.random.default_rng(2)
    head = descending(rng.random(FEATURE_WINDOW) + 1.0)
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
