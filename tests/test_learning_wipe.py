"""Learning state survives what registries survive (issue 23 item 8): a Redis wipe keeps policy
versions and usage memories (written back by the winner; every memory saved at a graceful
shutdown), and feedback for a shortlist whose record was lost (a wipe, a crash in local mode)
gets a clear 410 shortlist_expired instead of a 404; local pending shortlists survive a
graceful restart. A real redis-server."""

from __future__ import annotations

import time

import pytest
from pydantic import SecretStr

from registry.core import Shortlister
from registry.errors import ShortlistExpired, ShortlistNotFound
from registry.feedback import FeedbackRequest
from registry.request import ShortlistRequest
from registry.serving.stop_rules import StopRule
from tests.cores import new_core
from tests.redis_server import RedisServer
from tests.test_learning_api import CITIES, TOOLS
from tests.test_learning_redis import KNOBS, QUERY, eventually


@pytest.fixture
def own_redis(tmp_path):
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    yield server
    server.stop()


def core(settings, bor_policy, url: str, prefix: str, tmp) -> Shortlister:
    s = settings.model_copy(update={"redis_url": SecretStr(url), "redis_prefix": prefix, "data_dir": tmp, **KNOBS})
    return new_core(s, bor_policy=bor_policy)


def test_a_redis_wipe_keeps_policy_versions_usage_memory_and_says_410(
    settings, bor_policy, own_redis, redis_prefix, tmp_path
):
    a = core(settings, bor_policy, own_redis.url, redis_prefix, tmp_path / "a")
    b = core(settings, bor_policy, own_redis.url, redis_prefix, tmp_path / "b")
    late = None
    try:
        a.put_registry("w", TOOLS)
        eventually(lambda: b.ready and b.snapshots.has_registry("w"))
        a.policies.book.add(StopRule(bias_offset=1.0), "w", activate=True)
        eventually(lambda: b.shortlist(ShortlistRequest("w", QUERY)).policy_version == "refit-1")
        for i in range(10):
            sl = a.shortlist(ShortlistRequest("w", f"weather today in {CITIES[i]} city"))
            a.feedback(FeedbackRequest(sl.shortlist_id, ["weather_forecast"], success=True))
        eventually(lambda: b.learning_report("w")["events"] == 10)
        before_wipe = a.shortlist(ShortlistRequest("w", QUERY))  # no feedback for it yet
        eventually(lambda: a.store.client.exists(f"{redis_prefix}usage:w") == 1)

        a.store.client.flushall()
        # both replicas notice within a few sync intervals and keep serving the learned policy
        eventually(lambda: a.store.client.exists(f"{redis_prefix}policies:w") == 1)
        eventually(lambda: a.store.client.exists(f"{redis_prefix}usage:w") == 1)
        for replica in (a, b):
            for _ in range(20):
                assert replica.shortlist(ShortlistRequest("w", QUERY)).policy_version == "refit-1"
                time.sleep(0.02)
        assert [v["version"] for v in a.policies.listing("w")["versions"]] == ["default", "refit-1"]

        # feedback for the shortlist served before the wipe: 410 saying why, not 404
        with pytest.raises(ShortlistExpired) as expired:
            a.feedback(FeedbackRequest(before_wipe.shortlist_id, ["weather_forecast"]))
        assert "lost its data" in expired.value.message
        with pytest.raises(ShortlistNotFound):  # an id never served is still a 404
            a.feedback(FeedbackRequest("0" * 32, ["weather_forecast"]))

        # a replica started after the wipe finds the policy and the usage memory
        late = core(settings, bor_policy, own_redis.url, redis_prefix, tmp_path / "late")
        eventually(lambda: late.ready)
        assert late.shortlist(ShortlistRequest("w", QUERY)).policy_version == "refit-1"
        assert late.learning_report("w")["events"] == 10
        assert late.shortlist(ShortlistRequest("w", QUERY, k=4)).tools[0].name == a.shortlist(ShortlistRequest("w", QUERY, k=4)).tools[0].name
    finally:
        for c in (a, b, late):
            if c is not None:
                c.close()


def test_every_usage_memory_is_checkpointed_at_a_graceful_shutdown(
    settings, bor_policy, own_redis, redis_prefix, tmp_path
):
    a = core(settings, bor_policy, own_redis.url, redis_prefix, tmp_path / "a")
    try:
        a.put_registry("w", TOOLS)
        for i in range(5):
            sl = a.shortlist(ShortlistRequest("w", f"weather today in {CITIES[i]} city"))
            a.feedback(FeedbackRequest(sl.shortlist_id, ["weather_forecast"], success=True))
        eventually(lambda: a.store.client.exists(f"{redis_prefix}usage:w") == 1)
        a.store.client.delete(f"{redis_prefix}usage:w")  # lost, and nothing new to save
    finally:
        a.close()
    import redis

    assert redis.Redis.from_url(own_redis.url).exists(f"{redis_prefix}usage:w") == 1


def test_pending_shortlists_survive_a_graceful_local_restart_and_a_crash_says_410(settings, bor_policy):
    def local() -> Shortlister:
        return new_core(settings, bor_policy=bor_policy)

    first = local()
    first.put_registry("w", TOOLS)
    kept = first.shortlist(ShortlistRequest("w", QUERY))
    answered = first.shortlist(ShortlistRequest("w", "send an email"))
    first.feedback(FeedbackRequest(answered.shortlist_id, ["send_email"]))
    first.close()  # graceful: the pending shortlists are saved with the feedback log

    second = local()
    assert second.feedback(FeedbackRequest(kept.shortlist_id, ["get_weather"])).duplicate is False
    resent = second.feedback(FeedbackRequest(answered.shortlist_id, ["send_email"]))
    assert resent.duplicate is True  # still a resend
    lost = second.shortlist(ShortlistRequest("w", QUERY))
    # a crash: nothing saved (close() not called, the pending file never written)
    third = local()
    with pytest.raises(ShortlistExpired) as expired:
        third.feedback(FeedbackRequest(lost.shortlist_id, ["get_weather"]))
    assert "restarted without a graceful shutdown" in expired.value.message
    assert expired.value.details["shortlist_id"] == lost.shortlist_id
    second.close()
    third.close()


def test_the_http_face_answers_410_shortlist_expired(make_client):
    with make_client() as client:
        client.put("/registries/w", json=TOOLS)
    with make_client() as client:
        shortlist_id = client.post("/shortlist", json={"registry": "w", "query": QUERY}).json()["shortlist_id"]
    (client.app.state.service.core.settings.data_dir / "feedback" / "pending-shortlists.jsonl").unlink()
    with make_client() as client:  # as after kill -9: the pending shortlists were not saved
        r = client.post("/feedback", json={"shortlist_id": shortlist_id, "used": ["get_weather"]})
        assert r.status_code == 410, r.text
        assert r.json()["error"]["type"] == "shortlist_expired"
        assert client.post("/feedback", json={"shortlist_id": "f" * 32, "used": ["x"]}).status_code == 404


def test_a_redis_wipe_keeps_the_jobs_a_replica_holds(settings, bor_policy, own_redis, redis_prefix, tmp_path):
    s = settings.model_copy(update={"redis_url": SecretStr(own_redis.url), "redis_prefix": redis_prefix,
                                    "data_dir": tmp_path / "a", "async_write_min_texts": 2, **KNOBS})
    a = new_core(s, bor_policy=bor_policy)
    try:
        job = a.submit_write("put", "j", TOOLS)
        assert a.write_jobs.wait(job, 10) and job.state == "done"
        refit = a.policies.refit("j")
        key = f"{redis_prefix}job:write:{job.id}"
        assert a.store.client.exists(key) == 1
        a.store.client.flushall()
        eventually(lambda: a.store.client.exists(key) == 1)
        eventually(lambda: a.store.client.exists(f"{redis_prefix}job:refit:{refit.job}") == 1)
        other = core(settings, bor_policy, own_redis.url, redis_prefix, tmp_path / "b")
        try:  # another replica answers the poll from Redis
            eventually(lambda: other.ready)
            found = other.write_job("j", job.id)
            assert found is not None and found.state == "done" and found.info.version == 1
            assert other.policies.job("j", refit.job).state == "refused"
        finally:
            other.close()
    finally:
        a.close()
