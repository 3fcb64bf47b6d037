"""Exploration with logged propensities, the refit's swap guard, policy versions and rollback,
refit job states (issue 11 items 2-3)."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from registry.request import ShortlistRequest
from tests.conftest import weather_tools

START = time.time() - 86_400.0  # one event a second from here (under any rate limit)
SCORES = tuple(float(v) for v in np.linspace(0.9, 0.1, 51))


def _event(i: int, rank: int, margins: tuple[float, ...], registry: str = "r"):
    from registry.feedback.events import FeedbackEvent

    ranking = tuple(f"t{j}" for j in range(60))
    return FeedbackEvent(
        shortlist_id=f"s{i}", registry=registry, version=1, n_tools=100, k=len(margins),
        shown=ranking[: len(margins)], used=(f"t{rank}",), success=True, calls=(),
        presented_exact=rank < len(margins), presented_equivalent=rank < len(margins),
        p_rand_exact=0.1, p_rand_equivalent=0.1, received=START + i, ranking=ranking,
        depth_chosen=len(margins), propensity=1.0, policy_version="default",
        margins=margins, depth_bias=0.0, scores=SCORES,
    )


def easy_events(n: int = 400, registry: str = "r"):
    """The default rule shows 10 (no margin reaches 0); the used tool is always first."""
    rng = random.Random(1)
    return [
        _event(i, 0, tuple(-0.5 - rng.random() * 0.5 for _ in range(10)), registry)
        for i in range(n)
    ]


def spread_events(n: int = 400):
    """The default rule shows 10 and the used tool sits anywhere in the top 10."""
    rng = random.Random(2)
    return [_event(i, rng.randrange(10), tuple(-0.5 - rng.random() for _ in range(10))) for i in range(n)]


# -- exploration -------------------------------------------------------------------------------


def test_propensities_are_a_distribution_and_the_share_is_respected():
    from registry.serving.explore import Explorer, propensity

    for chosen, limit in ((3, 20), (18, 20), (20, 20)):
        total = sum(propensity(chosen, shown, limit, 0.05) for shown in range(chosen, limit + 1))
        assert total == pytest.approx(1.0)
    assert propensity(3, 3, 20, 0.05) == pytest.approx(0.95)
    assert propensity(3, 5, 20, 0.05) == pytest.approx(0.05 / 3)
    assert propensity(19, 20, 20, 0.3) == pytest.approx(0.3)  # 1, 2 and 3 extra all give 20
    explorer = Explorer(0.05, random.Random(7))
    draws = [explorer.draw(4, 20) for _ in range(20_000)]
    deeper = [s for s, _ in draws if s > 4]
    assert 0.04 < len(deeper) / len(draws) < 0.06
    assert set(deeper) == {5, 6, 7}
    assert all(p == pytest.approx(propensity(4, s, 20, 0.05)) for s, p in draws[:200])
    assert Explorer(0.0).draw(4, 20) == (4, 1.0)


def _tools(n: int = 60) -> list[dict]:
    words = ["weather", "email", "currency", "file", "calendar", "music", "stock", "map"]
    return [{"name": f"tool_{i}", "description": f"{words[i % 8]} helper {i} {words[i * 3 % 8]}"}
            for i in range(n)]


def test_explored_shortlists_log_depth_chosen_and_propensity(make_core):
    core = make_core(explore_share=1.0)  # every adaptive list is explored
    core.put_registry("big", _tools())
    explored = 0
    for query in ("weather helper", "email and currency", "music stock map", "file calendar"):
        result = core.shortlist(ShortlistRequest("big", query))
        s = core.feedback_recorder.memory.get(result.shortlist_id)
        assert s.k == result.k and s.k - s.depth_chosen in (0, 1, 2, 3)
        if s.k > s.depth_chosen:
            explored += 1
            assert s.propensity == pytest.approx(1 / 3) or s.k == 30  # 30: the cap, several extras
        # a fixed k is never explored
        fixed = core.feedback_recorder.memory.get(core.shortlist(ShortlistRequest("big", query, k=2)).shortlist_id)
        assert (fixed.k, fixed.depth_chosen, fixed.propensity) == (2, 2, 1.0)
    assert explored >= 3
    quiet = make_core(explore_share=0.0, data_dir=core.settings.data_dir / "q")
    quiet.put_registry("big", _tools())
    s = quiet.feedback_recorder.memory.get(quiet.shortlist(ShortlistRequest("big", "weather helper")).shortlist_id)
    assert s.k == s.depth_chosen and s.propensity == 1.0


# -- the refit and its guard ---------------------------------------------------------------------


def test_refit_ships_a_better_rule():
    from registry.learning.refit import refit
    from registry.serving.stop_rules import StopRule

    outcome = refit(easy_events(), "r", StopRule(), review_factor=20.0)  # 10 -> 1: past 1.5x
    assert outcome.state == "done", outcome.reason
    est = outcome.estimate
    assert est["candidate"]["found"] >= est["current"]["found"] == 1.0
    assert est["candidate"]["mean_k"] < est["current"]["mean_k"] == 10
    assert est["gain_ci"][0] > 0


def test_refit_refuses_a_candidate_that_is_not_better():
    from registry.learning.refit import refit
    from registry.serving.stop_rules import StopRule

    outcome = refit(spread_events(), "r", StopRule())  # only as deep as now keeps the found rate
    assert outcome.state == "refused"
    assert refit(easy_events(50), "r", StopRule()).reason.startswith("50 usable feedback events")


def test_refit_never_ships_a_lower_found_rate(monkeypatch):
    """Even a candidate far more efficient on the fitting part is refused when its held-out
    found rate is below the current one's."""
    from registry.learning import refit as refit_module
    from registry.serving.stop_rules import StopRule

    shallow = StopRule(bias_offset=-3.0)  # stops at 1: much shorter lists, fewer found
    monkeypatch.setattr(refit_module, "candidates", lambda fit, current: [shallow])
    monkeypatch.setattr(refit_module.LoggedEvents, "split", lambda self: (self, self))
    events = spread_events()
    for e in events[: len(events) // 2]:  # half the fitting data found at 1 as well
        object.__setattr__(e, "used", ("t0",))
    outcome = refit_module.refit(events, "r", StopRule())
    assert outcome.state == "refused"
    assert "no candidate keeps the found rate" in outcome.reason or "below the current" in outcome.reason


# -- versions, rollback and jobs over HTTP -----------------------------------------------------


def _fill_log(core, events):
    for e in events:
        core.feedback_recorder.log.append(e)


def test_versions_listing_activation_and_rollback(make_client):
    from registry.serving.stop_rules import StopRule

    with make_client() as client:
        client.put("/registries/w", json={"tools": weather_tools()})
        body = client.get("/registries/w/policies").json()
        assert body["active"] == body["serving"] == "default"
        assert [v["version"] for v in body["versions"]] == ["default"]
        core = client.app.state.service.core
        core.policies.book.add(StopRule(bias_offset=1.0), "w", activate=True)
        body = client.get("/registries/w/policies").json()
        assert body["active"] == body["serving"] == "refit-1"
        assert [v["version"] for v in body["versions"]] == ["default", "refit-1"]
        q = {"registry": "w", "query": "weather in Paris"}
        assert client.post("/shortlist", json=q).json()["policy_version"] == "refit-1"
        r = client.post("/registries/w/policies/default/activate", json={})
        assert r.status_code == 200 and r.json()["serving"] == "default"
        assert client.post("/shortlist", json=q).json()["policy_version"] == "default"
        assert client.post("/registries/w/policies/refit-1/activate", json={}).json()["active"] == "refit-1"
        assert client.post("/registries/w/policies/refit-9/activate", json={}).status_code == 404
        assert client.get("/registries/nope/policies").status_code == 404
        # the versions survive a restart (stored under the data dir)
    with make_client() as client:
        assert client.get("/registries/w/policies").json()["serving"] == "refit-1"
        client.delete("/registries/w")
        client.put("/registries/w", json={"tools": weather_tools()})
        assert client.get("/registries/w/policies").json()["active"] == "default"


def test_refit_job_states(make_client):
    with make_client(refit_review_factor=20.0) as client:
        client.put("/registries/w", json={"tools": weather_tools()})
        r = client.post("/registries/w/policies/refit", json={})  # synchronous, no feedback yet
        assert r.status_code == 200 and r.json()["state"] == "refused"
        assert "usable feedback events" in r.json()["reason"]
        core = client.app.state.service.core
        _fill_log(core, easy_events(400, "w"))
        r = client.post("/registries/w/policies/refit?async=true", json={})
        assert r.status_code == 202 and set(r.json()) == {"job", "state"}
        job = r.json()["job"]
        for _ in range(200):
            state = client.get(f"/registries/w/policies/refit/{job}").json()
            if state["state"] not in ("queued", "running"):
                break
            time.sleep(0.05)
        assert state["state"] == "done", state
        assert state["version"] == state["active"] == "refit-1"
        assert state["estimate"]["candidate"]["found"] >= state["estimate"]["current"]["found"]
        assert client.get("/registries/w/policies").json()["serving"] == "refit-1"
        q = {"registry": "w", "query": "weather in Paris"}
        assert client.post("/shortlist", json=q).json()["policy_version"] == "refit-1"
        # a second refit on the same data: the new rule is already as good -> refused, kept
        again = client.post("/registries/w/policies/refit", json={}).json()
        assert again["state"] == "refused" and again["active"] == "refit-1"
        assert client.get("/registries/w/policies/refit/nope").status_code == 404
        assert client.post("/registries/w/policies/refit?asynch=true", json={}).status_code == 422
        assert client.get(f"/registries/other/policies/refit/{job}").status_code in (404, 422)


def test_refit_and_activate_need_a_json_content_type(make_client):
    """A cross-site form POST (text/plain or no type, no preflight) must not start a refit or
    roll a policy back on a tokenless server (issue 23): 415, like every other write."""
    from registry.serving.stop_rules import StopRule

    with make_client() as client:
        client.put("/registries/w", json={"tools": weather_tools()})
        core = client.app.state.service.core
        core.policies.book.add(StopRule(bias_offset=1.0), "w", activate=True)
        for path in ("/registries/w/policies/refit", "/registries/w/policies/refit?async=true",
                     "/registries/w/policies/default/activate"):
            for headers in ({}, {"content-type": "text/plain"},
                            {"content-type": "application/x-www-form-urlencoded"}):
                r = client.post(path, content=b"x=1" if headers else b"", headers=headers)
                assert r.status_code == 415, (path, headers, r.status_code)
                assert r.json()["error"]["type"] == "unsupported_media_type"
        assert client.get("/registries/w/policies").json()["active"] == "refit-1"  # nothing moved
        r = client.post("/registries/w/policies/default/activate", headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.json()["active"] == "default"  # no body is fine


def test_refit_job_failure_is_reported(make_client, monkeypatch):
    from registry.learning import manager

    def boom(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(manager, "refit", boom)
    with make_client() as client:
        client.put("/registries/w", json={"tools": weather_tools()})
        body = client.post("/registries/w/policies/refit", json={}).json()
        assert body["state"] == "failed" and "disk on fire" in body["reason"]
        assert client.get("/registries/w/policies").json()["active"] == "default"


def test_cli_refit_writes_a_version_a_server_then_serves(settings, make_client, monkeypatch, capsys):
    import json

    from registry.feedback import LocalFeedbackLog
    from service.cli import main

    log = LocalFeedbackLog.in_data_dir(settings.data_dir, archive=False)
    for e in easy_events(300, "w"):
        log.append(e)
    monkeypatch.setenv("SHORTLIST_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("SHORTLIST_REFIT_REVIEW_FACTOR", "20")
    monkeypatch.setenv("SHORTLIST_REDIS_URL", "")
    assert main(["refit", "--registry", "w"]) == 0
    job = json.loads(capsys.readouterr().out)
    assert job["state"] == "done" and job["version"] == "refit-1"
    with make_client() as client:
        client.put("/registries/w", json={"tools": weather_tools()})
        assert client.get("/registries/w/policies").json()["serving"] == "refit-1"


def test_one_shared_token_still_refits_and_repeated_claims_decay():
    """Issue 23 finding 2: with one token for every agent, the old share cap left 1 usable
    event of 260 ("1 usable feedback events"); now all count, by the memory's evidence rule."""
    from dataclasses import replace

    from registry.learning.evidence import EvidenceConfig
    from registry.learning.refit import LoggedEvents, refit
    from registry.serving.stop_rules import StopRule

    shared = [replace(e, caller="one-token") for e in easy_events(260)]
    data = LoggedEvents.of(shared, "r", EvidenceConfig())
    assert len(data) == 260
    assert refit(shared, "r", StopRule(), min_events=200).state == "candidate"  # 10 -> 1: a candidate
    assert refit(shared, "r", StopRule(), min_events=200, review_factor=20.0).state == "done"
    # the same tool claimed over and over by one caller decays: 1 / (1 + j / half_life)
    weights = data.weights()
    assert weights[0] == 1.0 and weights[4] == pytest.approx(0.5) and weights[-1] < 0.02
    # distinct tools do not decay each other
    spread = [replace(e, caller="one-token", used=(f"t{i % 10}",)) for i, e in enumerate(easy_events(10))]
    assert list(LoggedEvents.of(spread, "r").weights()) == [1.0] * 10


def test_refit_rate_limits_a_caller_per_minute():
    from dataclasses import replace

    from registry.learning.evidence import EvidenceConfig
    from registry.learning.refit import LoggedEvents

    minute = (START // 60) * 60  # the limit counts per clock minute: keep the burst inside one
    burst = [replace(e, caller="c", received=minute + i / 100, used=(f"t{i % 10}",))
             for i, e in enumerate(easy_events(300))]
    assert len(LoggedEvents.of(burst, "r", EvidenceConfig(per_minute=100))) == 100


def _deep_attack_events(n: int, registry: str = "r"):
    """Feedback claiming the 9th tool: the default rule stops at 2, a bias of 0.85 reaches 9."""
    margins = (-0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 3.0, 3.0)
    return [_event(i, 8, margins, registry) for i in range(n)]


def test_refit_cannot_be_driven_deep_by_fake_feedback():
    """Issue 23 finding 4: 300 events claiming a rank-8 tool shipped mean K 1.37 -> 8.83; a
    deeper candidate must now beat fixed top-K at its own depth, which such feedback never does."""
    from registry.learning.refit import refit
    from registry.serving.stop_rules import StopRule

    outcome = refit(_deep_attack_events(300), "r", StopRule(), min_events=200)
    assert outcome.state == "refused", outcome.reason
    assert "does not beat fixed top-K" in outcome.reason
    assert outcome.estimate["candidate"]["mean_k"] > 4 * outcome.estimate["current"]["mean_k"]


def test_a_refit_changing_mean_k_a_lot_stays_a_candidate(make_client):
    """Half the events find their tool at once, half need 6: a deeper rule beats fixed top-K
    (it deepens only where needed) but triples mean K: stored, not activated."""
    from registry.learning.refit import refit
    from registry.serving.stop_rules import StopRule

    rng = random.Random(3)
    quick = (5.0,) * 10
    slow = (0.1, 0.2, 0.3, 0.4, 0.5, 3.0, 3.0, 3.0, 3.0, 3.0)
    events = [_event(i, 0, quick) if rng.random() < 0.5 else _event(i, 5, slow) for i in range(400)]
    outcome = refit(events, "r", StopRule(), min_events=200)
    assert outcome.state == "candidate", outcome.reason
    assert outcome.rule is not None and outcome.estimate["candidate"]["mean_k"] > 2.5
    assert refit(events, "r", StopRule(), min_events=200, review_factor=10.0).state == "done"
