"""The learning loop's fields on remembered shortlists and feedback events: query, caller,
ranking, depth chosen, propensity, policy version; old records stay readable."""

from __future__ import annotations

import pytest

from registry.feedback import FeedbackRequest
from registry.request import ShortlistRequest
from tests.conftest import weather_tools
from tests.cores import new_core


def _tools(n: int = 40) -> list[dict]:
    words = ["weather", "email", "currency", "file", "calendar", "music", "stock", "map"]
    return [
        {"name": f"tool_{i}", "description": f"{words[i % 8]} helper number {i} for {words[(i * 3) % 8]}"}
        for i in range(n)
    ]


def test_old_records_read_with_defaults():
    from registry.feedback.events import FeedbackEvent, ShownShortlist

    old = {"shortlist_id": "a", "registry": "r", "version": 1, "n_tools": 10, "k": 3,
           "shown": ["x", "y", "z"], "created": 5.0}
    s = ShownShortlist.from_json(old)
    assert (s.query, s.caller, s.ranking, s.depth_chosen, s.propensity, s.policy_version) == (
        "", None, (), 3, 1.0, "")
    ev = FeedbackEvent.from_json({
        **old, "used": ["y"], "success": None, "calls": [], "presented_exact": True,
        "presented_equivalent": True, "p_rand_exact": 0.3, "p_rand_equivalent": 0.3,
        "received": 6.0,
    })
    assert ev.depth_chosen == 3 and ev.rank_of({"y"}) == 1 and ev.rank_of({"q"}) is None


def test_round_trip_and_build_event_copies_fields():
    from registry.feedback.events import (
        EquivalenceClasses,
        FeedbackEvent,
        ShownShortlist,
        build_event,
    )

    s = ShownShortlist("a", "r", 1, 10, 3, ("x", "y", "z"), 5.0, query="q" * 10, caller="c1",
                       ranking=("x", "y", "z", "w"), depth_chosen=2, propensity=0.0167,
                       policy_version="refit-2", margins=(-1.0, 0.5), depth_bias=0.0)
    assert ShownShortlist.from_json(s.to_json()) == s
    ev = build_event(s, ["w"], None, True, {"x", "y", "z", "w"}, EquivalenceClasses(), 7.0,
                     caller="c2")
    assert ev.caller == "c2" and ev.query == "q" * 10 and ev.policy_version == "refit-2"
    assert (ev.depth_chosen, ev.propensity, tuple(ev.margins)) == (2, 0.0167, (-1.0, 0.5))
    assert ev.rank_of({"w"}) == 3 and not ev.presented_exact  # ranked, not shown: rank known
    assert FeedbackEvent.from_json(ev.to_json()) == ev


def test_the_shown_shortlist_and_its_feedback_event_carry_one_trace():
    """The trace fields are declared once (ServedTrace): every one the shortlist remembers
    reaches its event, which replaces only the caller (who sent the feedback)."""
    from registry.feedback.events import (
        EquivalenceClasses,
        FeedbackEvent,
        ShownShortlist,
        build_event,
    )
    from registry.feedback.served import TRACE_FIELDS, ServedTrace

    assert issubclass(ShownShortlist, ServedTrace) and issubclass(FeedbackEvent, ServedTrace)
    s = ShownShortlist("a", "r", 1, 10, 3, ("x", "y", "z"), 5.0, query="q", caller="asker",
                       ranking=("x", "y", "z", "w"), depth_chosen=2, propensity=0.5,
                       policy_version="refit-2", margins=(-1.0, 0.5), depth_bias=0.25, scores=(0.9, 0.4))
    ev = build_event(s, ["w"], None, True, {"x", "y", "z", "w"}, EquivalenceClasses(), 7.0, caller="sender")
    assert ev.trace() == {**s.trace(), "caller": "sender"}
    assert set(ev.trace()) == set(TRACE_FIELDS) and len(TRACE_FIELDS) == 9


@pytest.fixture
def core(settings, bor_policy):

    core = new_core(settings.model_copy(update={"explore_share": 0.0}), bor_policy=bor_policy)
    yield core
    core.close()


def test_core_logs_query_caller_ranking_and_policy(core):
    core.put_registry("big", _tools())
    query = "weather helper " + "x" * 2000
    result = core.shortlist(ShortlistRequest("big", query), caller="abc")
    assert result.policy_version == "default" and result.to_json()["policy_version"] == "default"
    remembered = core.feedback_recorder.memory.get(result.shortlist_id)
    assert remembered.caller == "abc" and remembered.query == query[:1000]
    shown = [t.name for t in result.tools]
    assert list(remembered.ranking[: len(shown)]) == shown
    assert len(remembered.ranking) > len(shown)  # the tail past the cut is logged
    assert remembered.depth_chosen == result.k and remembered.propensity == 1.0
    assert len(remembered.margins) >= result.k
    deep = remembered.ranking[len(shown)]
    fb = core.feedback(FeedbackRequest(result.shortlist_id, [deep]), caller="def")
    assert fb.event.caller == "def" and fb.event.rank_of({deep}) == len(shown)
    # a fixed k is never explored and names its policy
    fixed = core.shortlist(ShortlistRequest("big", "weather", k=2))
    assert fixed.policy_version == "fixed"
    assert core.feedback_recorder.memory.get(fixed.shortlist_id).propensity == 1.0


def test_caller_hash_over_http(make_client):
    from pydantic import SecretStr

    from service.auth import caller_hash

    with make_client(query_token=(SecretStr("q" * 20),)) as client:
        client.put("/registries/w", json={"tools": weather_tools()})
        headers = {"Authorization": "Bearer " + "q" * 20}
        body = client.post("/shortlist", json={"registry": "w", "query": "weather"}, headers=headers).json()
        assert body["policy_version"] == "default"
        core = client.app.state.service.core
        remembered = core.feedback_recorder.memory.get(body["shortlist_id"])
        assert remembered.caller == caller_hash("Bearer " + "q" * 20, core.settings, key=core.caller_key())
        assert remembered.caller is not None and len(remembered.caller) == 16
        assert "q" * 20 not in remembered.caller
        r = client.post("/feedback", json={"shortlist_id": body["shortlist_id"], "used": ["get_weather"]},
                        headers=headers)
        assert r.status_code == 200
    from service.settings import ServiceSettings

    assert caller_hash("Bearer x", ServiceSettings()) is None  # no tokens configured
