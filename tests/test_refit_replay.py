"""Issue 22 item 2: the refit learns the depth this registry needs. It fits on the ranking the
registry serves now (replayed), counts every used tool of a multi-tool request, and places the
tools agents found elsewhere at their rank in the new ranking."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from registry.feedback import FeedbackRequest
from registry.request import ShortlistRequest
from tests.conftest import weather_tools
from tests.test_policies import _event, easy_events


def test_needed_rank_is_the_deepest_used_tool():
    from registry.learning.refit_data import needed_rank

    order = ("a", "b", "c", "d")
    assert needed_rank(order, ["a"]) == 0
    assert needed_rank(order, ["c", "a"]) == 2
    assert needed_rank(order, ["a", "zz"]) is None  # one used tool past the ranking: censored
    assert needed_rank(order, []) is None


def test_a_multi_tool_registry_keeps_lists_deep_enough_for_every_used_tool():
    """Half the requests use t0 and t3. Counting only the first used tool, a rule stopping at 1
    looked as good as showing 10 and shipped; every used tool must be shown now."""
    from registry.learning.refit import refit
    from registry.learning.refit_data import rule_depths
    from registry.serving.stop_rules import StopRule

    events = easy_events(400)
    events = [replace(e, used=("t0", "t3")) if i % 2 else e for i, e in enumerate(events)]
    outcome = refit(events, "r", StopRule(), review_factor=20.0)
    est = outcome.estimate
    assert est["data"]["multi_tool_rate"] == pytest.approx(0.5, abs=0.01)
    assert est["current"]["found"] == 1.0
    if outcome.rule is not None:
        from registry.learning.refit import LoggedEvents

        data = LoggedEvents.of(events, "r")
        depths = rule_depths(outcome.rule, data)
        multi = np.array([e.rank == 3 for e in data.events])
        assert depths[multi].min() >= 4, outcome.reason  # t3 shown wherever it is needed
        assert est["candidate"]["found"] == 1.0


def _censored_events(n: int = 400):
    """The default rule shows 10; the used tool was found elsewhere: past the logged ranking."""
    rng = random.Random(3)
    out = []
    for i in range(n):
        e = _event(i, 0, tuple(-0.5 - rng.random() * 0.5 for _ in range(10)))
        out.append(replace(e, used=("elsewhere",), presented_exact=False, presented_equivalent=False,
                           query=f"request {i % 40}"))
    return out


def test_the_refit_fits_the_replayed_ranking_and_counts_tools_found_elsewhere():
    """Logged, no rule could find the tool (it sat past the ranking), so every rule found
    nothing and the shortest list "won": the refit cut lists to 1 on a registry whose agents
    all had to look elsewhere. Ranked again as served now (say the profiles lifted it to rank
    5), the refit sees it and keeps lists that show it."""
    from registry.learning.refit import refit
    from registry.serving.replay import ReplayedRanking
    from registry.serving.stop_rules import StopRule

    events = _censored_events()
    logged = refit(events, "r", StopRule(), review_factor=20.0)
    assert logged.estimate["data"]["found_elsewhere"] == 400
    assert logged.estimate["data"]["found_elsewhere_logged_in_reach"] == 0
    assert logged.estimate["current"]["found"] == 0.0
    assert logged.estimate["candidate"]["mean_k"] < 2  # blind to them: shorter looked free

    calls = []

    def replay(event):
        calls.append(event.shortlist_id)
        margins = np.asarray(event.margins, np.float64)
        feats = np.zeros((len(margins), 18))
        ranking = (*event.ranking[:5], "elsewhere", *event.ranking[5:])
        return ReplayedRanking(margins, feats, ranking, "1")

    outcome = refit(events, "r", StopRule(), review_factor=20.0, replay=replay)
    assert len(calls) == 400
    data = outcome.estimate["data"]
    assert data["replayed"] is True and data["found_elsewhere_in_reach"] == 400
    assert outcome.estimate["current"]["found"] == 1.0
    assert outcome.estimate["candidate"]["found"] == 1.0  # no shorter list that hides it
    assert outcome.estimate["candidate"]["mean_k"] >= 6
    assert outcome.state == "refused"  # (nothing here says where to stop sooner: keep 10)


def test_a_refit_replays_through_the_schema_of_the_policy_and_falls_back_when_it_cannot():
    from registry.learning.refit import refit
    from registry.serving.replay import ReplayedRanking
    from registry.serving.stop_rules import StopRule

    events = easy_events(400)
    schema2 = refit(
        events, "r", StopRule(), review_factor=20.0,
        replay=lambda e: ReplayedRanking(np.asarray(e.margins), np.zeros((10, 24)), e.ranking, "2"),
    )
    assert schema2.estimate["data"]["feature_schema"] == "2"
    assert schema2.rule is not None and schema2.rule.feature_schema == "2"
    fallback = refit(events, "r", StopRule(), review_factor=20.0, replay=lambda e: None)
    assert "400" not in fallback.estimate["data"]["replay_fallback"]
    assert fallback.estimate["data"]["replayed"] is False and fallback.state == "done"


def test_a_calibrated_rule_of_another_schema_serves_the_networks_stop(make_core):
    """A restart with a policy of another feature schema must not break the query path."""
    from registry.serving.stop_rules import StopRule

    core = make_core()
    core.put_registry("w", weather_tools())
    rule = StopRule(weights=(0.0,) * 26, center=(0.0,) * 25, scale=(1.0,) * 25, threshold=0.1,
                    feature_schema="2")
    core.policies.book.add(rule, "w", activate=True)
    result = core.shortlist(ShortlistRequest("w", "weather in Paris"))
    assert result.policy_version == "refit-1" and 1 <= result.k <= 4
    default = core.shortlist(ShortlistRequest("w", "weather in Paris", policy="bor"))
    assert default.k == result.k


def test_the_cores_refit_replays_logged_requests_on_the_ranking_served_now(make_core):
    """The core lends the refit a replay at construction; it ranks a logged request as
    /shortlist does now, margins and all (no learning yet: the same as logged)."""
    core = make_core()
    core.put_registry("w", weather_tools())
    assert core.policies.hooks.fit_profiles is not None and core.policies.hooks.replay is not None
    result = core.shortlist(ShortlistRequest("w", "convert 10 dollars to euros"), caller="c")
    core.feedback(FeedbackRequest(result.shortlist_id, ["convert_currency"], success=True), caller="c")
    (event,) = core.feedback_recorder.log.replay()
    replay = core.policies.hooks.replay("w")
    assert replay is not None and core.policies.hooks.replay("nope") is None
    again = replay(event)
    assert again is not None and again.schema == "1"
    assert again.ranking[: len(event.ranking)] == tuple(event.ranking)[: len(again.ranking)]
    assert np.allclose(again.margins, np.asarray(event.margins), atol=1e-3)
    job = core.policies.refit("w")
    assert job.estimate["data"]["replayed"] is True or "replay_fallback" in job.estimate["data"]


def test_the_profile_weight_is_fitted_on_the_ranking_a_new_phrasing_meets(make_core, monkeypatch):
    """The logged ranking of a repeated request recalls its own earlier feedback (the memory),
    so a weight fitted on it measured nothing; the refit hands the fit each request's ranking
    before the profiles, the memory's recall of the request's own repeats left out."""
    core = make_core()
    core.put_registry("w", weather_tools())
    seen: list = []
    real = core.learning.fit_profile_weight

    def spy(snap, events, base_ranking=None, **kwargs):
        seen.append(base_ranking)
        return real(snap, events, base_ranking, **kwargs)

    monkeypatch.setattr(core.learning, "fit_profile_weight", spy)
    for i in range(120):
        sl = core.shortlist(ShortlistRequest("w", f"convert {i} dollars to euros"), caller=f"c{i % 10}")
        core.feedback(FeedbackRequest(sl.shortlist_id, ["convert_currency"], success=True), caller=f"c{i % 10}")
    job = core.policies.refit("w")
    (ranked,) = seen
    assert ranked is not None and job.estimate["profile"]["events"] == 120
    names, scores = ranked("convert 3 dollars to euros")
    assert set(names) == {t["name"] if "name" in t else t["function"]["name"] for t in weather_tools()}
    assert len(scores) == len(names) and list(scores) == sorted(scores, reverse=True)
    # a base ranking that never ranks the used tool among the candidates: nothing to fit on
    snap = core.snapshot("w")
    events = list(core.feedback_recorder.log.replay())
    report = real(snap, events, lambda text: (("get_weather", "send_email"), np.array([0.9, 0.8])))
    assert report["weight"] == 0.0 and "rank a used tool" in report["reason"]


def test_the_refit_holds_out_requests_not_repeats_of_fitted_ones():
    """A stream repeats its requests: the refit's held-out part must be requests it did not fit
    on (split by request text), and its bound resamples requests, not their repeated events."""
    from registry.learning.refit import _bootstrap_mean
    from registry.learning.refit_data import LoggedEvent, LoggedEvents

    def event(i: int, text: str) -> LoggedEvent:
        return LoggedEvent(f"s{i}", np.zeros(3), np.zeros((3, 2)), 0.0, 0.0, 1.0, text)

    data = LoggedEvents(tuple(event(i, f"request {i % 40}") for i in range(400)))
    fit, held = data.split()
    assert len(held) and len(fit)
    assert not {e.request for e in fit.events} & {e.request for e in held.events}
    assert LoggedEvents((event(0, ""),)).events[0].group == "shortlist:s0"
    gains = np.zeros(400)
    gains[[i for i in range(400) if i % 40 == 0]] = 1.0  # every repeat of one request gains
    groups = [e.group for e in data.events]
    assert _bootstrap_mean(gains, 0.9)[0] > 0  # over events: ten lucky repeats look like evidence
    assert _bootstrap_mean(gains, 0.9, groups=groups)[0] == 0.0  # one request of 40 is not
