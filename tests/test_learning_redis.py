"""Usage memory across two replicas sharing a real Redis: feedback on one lifts on the other,
switch and wipe reach both, the memory is saved to Redis and restored by a new replica."""

from __future__ import annotations

import time

import pytest
from pydantic import SecretStr

from registry.core import Shortlister
from registry.feedback import FeedbackRequest
from registry.request import ShortlistRequest
from tests.cores import new_core
from tests.test_learning_api import CITIES, TOOLS

KNOBS = {"learning_beta": 1.0, "learning_similarity": 0.5, "learning_save_interval_seconds": 0.2,
         "sync_interval_seconds": 0.2}
QUERY = "weather today in london city"


def core(settings, bor_policy, url: str, prefix: str, tmp) -> Shortlister:
    s = settings.model_copy(update={"redis_url": SecretStr(url), "redis_prefix": prefix, "data_dir": tmp, **KNOBS})
    return new_core(s, bor_policy=bor_policy)


def top(c: Shortlister) -> str:
    return c.shortlist(ShortlistRequest("w", QUERY, k=4)).tools[0].name


def eventually(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail("condition not met in time")
        time.sleep(0.05)


def test_two_replicas_learn_together(settings, bor_policy, redis_server, redis_prefix, tmp_path):
    a = core(settings, bor_policy, redis_server.url, redis_prefix, tmp_path / "a")
    b = core(settings, bor_policy, redis_server.url, redis_prefix, tmp_path / "b")
    try:
        a.put_registry("w", TOOLS)
        eventually(lambda: b.ready and b.snapshots.has_registry("w"))
        assert top(a) == top(b) == "get_weather"
        for i in range(10):
            sl = a.shortlist(ShortlistRequest("w", f"weather today in {CITIES[i]} city"))
            a.feedback(FeedbackRequest(sl.shortlist_id, ["weather_forecast"], success=True))
        assert top(a) == "weather_forecast"
        eventually(lambda: top(b) == "weather_forecast")  # b folded a's events from the stream
        eventually(lambda: b.learning_report("w")["events"] == 10)
        b.set_learning("w", False)
        eventually(lambda: top(a) == "get_weather")  # b's switch reached a
        b.set_learning("w", True)
        eventually(lambda: top(a) == "weather_forecast")
        eventually(lambda: a.store.client.exists(f"{redis_prefix}usage:w") == 1)  # saved
        c = core(settings, bor_policy, redis_server.url, redis_prefix, tmp_path / "c")
        try:  # a new replica restores the saved memory (and skips the events it already holds)
            eventually(lambda: c.ready and c.learning_report("w")["events"] == 10)
            assert top(c) == "weather_forecast"
            time.sleep(1.0)  # several ticks: the stream's 10 events are not counted again
            assert c.learning_report("w")["events"] == 10
        finally:
            c.close()
        a.wipe_learning("w")
        eventually(lambda: top(b) == "get_weather")  # the wipe reached b
        assert b.learning_report("w")["entries"] == 0
        a.delete_registry("w")
        eventually(lambda: a.store.client.exists(f"{redis_prefix}usage:w") == 0)
    finally:
        a.close()
        b.close()


def load_and_teach(a: Shortlister, b: Shortlister) -> None:
    """Registry "w" on replica a (seen by b), then 60 feedback events for new phrasings of a
    forecast, from ten callers."""
    a.put_registry("w", TOOLS)
    eventually(lambda: b.ready and b.snapshots.has_registry("w"))
    for i in range(60):
        sl = a.shortlist(ShortlistRequest("w", f"forecast for {CITIES[i % len(CITIES)]} number {i}"))
        a.feedback(FeedbackRequest(sl.shortlist_id, ["weather_forecast"], success=True), caller=f"c{i % 10}")


def lifted(c: Shortlister) -> list[tuple[str, float]]:
    """A phrasing no event used, ranked by ``c``: names and scores (4 decimals)."""
    result = c.shortlist(ShortlistRequest("w", "forecast for paris next week", k=4))
    return [(t.name, round(t.score, 4)) for t in result.tools]


def test_two_replicas_serve_the_profile_weight_a_refit_fitted(
    settings, bor_policy, redis_server, redis_prefix, tmp_path, monkeypatch
):
    """A refit on one replica fits the registry's profile weight; the other serves the same
    weight (the control record in Redis) and so the same lifted ranking."""
    from registry.learning import learner as learner_module

    fitted = {"reason": "shipped", "best_weight": 0.4}
    monkeypatch.setattr(learner_module, "fit_weight", lambda *args, **kwargs: (0.4, dict(fitted)))
    a = core(settings, bor_policy, redis_server.url, redis_prefix, tmp_path / "a")
    b = core(settings, bor_policy, redis_server.url, redis_prefix, tmp_path / "b")
    try:
        load_and_teach(a, b)
        assert b.learning.memory.weight("w") == 0.0
        job = a.policies.refit("w")
        assert job.estimate["profile"]["weight"] == 0.4, job
        eventually(lambda: b.learning.memory.weight("w") == 0.4)
        assert b.learning_report("w")["profile_weight"] == 0.4
        assert b.learning_report("w")["profile_fit"]["reason"] == "shipped"
        eventually(lambda: b.learning_report("w")["events"] == a.learning_report("w")["events"])
        eventually(lambda: lifted(a) == lifted(b))
    finally:
        a.close()
        b.close()


def test_two_replicas_serve_the_neighbourhood_a_refit_fitted(
    settings, bor_policy, redis_server, redis_prefix, tmp_path, monkeypatch
):
    """A refit on one replica fits the usage memory's neighbourhood; the other applies the same
    one (the control record in Redis), so both lift the same tools for a new phrasing."""
    from registry.learning import learner as learner_module

    monkeypatch.setattr(learner_module, "fit_similarity", lambda *args, **kwargs: (0.99, {"reason": "repeats only"}))
    a = core(settings, bor_policy, redis_server.url, redis_prefix, tmp_path / "a")
    b = core(settings, bor_policy, redis_server.url, redis_prefix, tmp_path / "b")
    try:
        load_and_teach(a, b)
        assert b.learning.memory.similarity("w") == 0.5  # the setting (KNOBS)
        job = a.policies.refit("w")
        assert job.estimate["profile"]["neighbourhood"]["similarity"] == 0.99, job
        eventually(lambda: b.learning.memory.similarity("w") == 0.99)
        assert b.learning_report("w")["similarity_fit"] == {"reason": "repeats only"}
        eventually(lambda: b.learning_report("w")["events"] == a.learning_report("w")["events"])
        eventually(lambda: lifted(a) == lifted(b))
    finally:
        a.close()
        b.close()
