"""Coverage refinement (registry.serving.coverage): features, the fit, trim/extend, the artifact
check, and the query path with a model configured. Fixtures only (hashing embedder)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from registry.errors import ArtifactError
from registry.serving.coverage import (
    COVERAGE_FEATURE_NAMES,
    COVERAGE_WINDOW,
    CoverageModel,
    coverage_features,
)
from registry.serving.needs import request_signals

F = len(COVERAGE_FEATURE_NAMES)
SHOWN = COVERAGE_FEATURE_NAMES.index("shown")
BEYOND = COVERAGE_FEATURE_NAMES.index("beyond_list")
CUR = COVERAGE_FEATURE_NAMES.index("cur_score")


def _model(coef: dict[str, float], intercept: float, tau_add: float, tau_drop: float) -> CoverageModel:
    weights = [coef.get(n, 0.0) for n in COVERAGE_FEATURE_NAMES]
    return CoverageModel((intercept, *weights), (0.0,) * F, (1.0,) * F, tau_add, tau_drop)


def test_features_one_row_per_position_with_the_list_columns():
    scores = np.linspace(0.9, 0.1, 30)
    shown = [True, True, False] + [False] * 27
    x = coverage_features(scores, 100, request_signals("find the file and email it"), shown, 2)
    assert x.shape == (COVERAGE_WINDOW, F)  # the window, not the 30 scores
    assert x[:, SHOWN].tolist()[:3] == [1.0, 1.0, 0.0]
    assert x[:, BEYOND].tolist()[:3] == [0.0, 0.0, 1.0]
    assert np.allclose(x[:, CUR], scores[:COVERAGE_WINDOW])
    assert coverage_features(scores, 5, None, shown, 2).shape == (5, F)  # never past the registry
    assert coverage_features(scores[:0], 5, None, [], 0).shape == (0, F)


def test_fit_learns_which_positions_hold_needed_tools():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, F))
    y = (x[:, CUR] + 0.3 * rng.normal(size=2000) > 0.5).astype(float)
    model = CoverageModel.fit(x, y, np.ones(2000), tau_add=0.5, tau_drop=0.1)
    p = model.probabilities(x)
    assert p[y == 1].mean() > 0.7 > 0.3 > p[y == 0].mean()
    assert model.coef[1 + CUR] == max(model.coef[1:])  # the informative column carries the weight
    with pytest.raises(ValueError):
        CoverageModel.fit(x, y[:10], np.ones(10), 0.5, 0.1)


def test_refine_trims_a_one_intent_list_and_extends_with_likely_tools():
    model = _model({}, 0.0, tau_add=0.6, tau_drop=0.2)
    ranking = [10, 11, 12, 13, 14]
    p = np.array([0.9, 0.1, 0.05, 0.7, 0.3])
    # 11 and 12 are unlikely: trimmed (12 is named: kept); 13 is likely: appended
    assert model.refine([10, 11, 12], ranking, p, keep={12}, offered={10, 11, 12}, trim=True, limit=5) == [10, 12, 13]
    # a several-intent list is never trimmed, only extended
    assert model.refine([10, 11], ranking, p, keep=set(), offered={10, 11}, trim=False, limit=5) == [10, 11, 13]
    # the first tool always stays; an alternate already offered is not appended; the limit holds
    low = np.array([0.01, 0.9, 0.9, 0.9, 0.9])
    assert model.refine([10], ranking, low, keep=set(), offered={10, 11}, trim=True, limit=3) == [10, 12, 13]
    # a tool outside the window has no probability: kept
    assert model.refine([10, 99], ranking, p, keep=set(), offered={10, 99}, trim=True, limit=2) == [10, 99]


def test_save_load_round_trip_and_a_bad_file_names_itself_and_the_command(tmp_path):
    model = _model({"cur_score": 2.0}, -1.0, 0.15, 0.04)
    path = tmp_path / "coverage.json"
    model.save(path, trained_on=["a", "b"])
    assert CoverageModel.load(path) == model
    raw = json.loads(path.read_text())
    for broken in ({**raw, "features": raw["features"][:-1]}, {**raw, "coef": raw["coef"][:3]},
                   {**raw, "tau_add": "nan"}):
        path.write_text(json.dumps(broken))
        with pytest.raises(ArtifactError, match=r"coverage\.json.*bench/studies/coverage_loso\.py"):
            CoverageModel.load(path)
    with pytest.raises(ArtifactError, match=r"missing\.json"):
        CoverageModel.load(tmp_path / "missing.json")


def _tools(n: int) -> list[dict]:
    topics = ["weather forecast", "send email", "currency exchange", "read file", "write file", "calendar event",
              "translate text", "stock price", "news headlines", "image resize", "music playlist", "flight booking"]
    return [{"name": f"tool_{i}", "description": f"{topics[i % len(topics)]} number {i}"} for i in range(n)]


def test_the_query_path_applies_a_configured_model(make_core, tmp_path):
    from registry.request import ShortlistRequest

    plain = make_core()
    plain.put_registry("r", _tools(12))
    base = plain.shortlist(ShortlistRequest("r", "weather forecast for Paris"))
    # every tool of the window "needed": extended, but never past half the registry
    always = tmp_path / "always.json"
    _model({}, 10.0, tau_add=0.5, tau_drop=0.0).save(always)
    core = make_core(coverage_model=always)
    core.put_registry("r", _tools(12))
    wide = core.shortlist(ShortlistRequest("r", "weather forecast for Paris"))
    assert wide.k == 6 > base.k - 1 and [t.name for t in wide.tools][: base.k] == [t.name for t in base.tools]
    # nothing "needed": a one-intent list keeps its first tool only
    never = tmp_path / "never.json"
    _model({}, -10.0, tau_add=0.5, tau_drop=0.5).save(never)
    core = make_core(coverage_model=never)
    core.put_registry("r", _tools(12))
    short = core.shortlist(ShortlistRequest("r", "weather forecast for Paris"))
    assert [t.name for t in short.tools] == [base.tools[0].name]
    # a fixed k is exactly k, whatever the model says
    assert core.shortlist(ShortlistRequest("r", "weather forecast for Paris", k=4)).k == 4


def test_a_small_registry_is_never_shown_whole(make_core, tmp_path):
    from registry.request import ShortlistRequest

    always = tmp_path / "always.json"
    _model({}, 10.0, tau_add=0.5, tau_drop=0.0).save(always)
    core = make_core(coverage_model=always)
    core.put_registry("r", _tools(5))
    assert core.shortlist(ShortlistRequest("r", "weather forecast for Paris")).k == 4


def test_a_corrupt_model_is_a_start_up_error(make_core, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    core = make_core(coverage_model=bad)  # readiness reports it, naming the file and the command
    assert core.load_error and "bad.json" in core.load_error and "coverage_loso.py" in core.load_error
