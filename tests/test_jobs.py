"""Bounded, durable background jobs (issue 23 items 4 and 7): one refit at a time per process,
bounded queues answering 429 with Retry-After, refits reading the log incrementally, upload and
refit jobs that survive a restart (resumed, or failed saying why; never a 404)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fastapi.testclient import TestClient

from tests.conftest import weather_tools
from tests.test_policies import easy_events

JSON = {"content-type": "application/json"}  # refits are writes: JSON only


class GatedEmbedder:
    """The fast fake embedder, whose document embedding of ``min_texts`` or more texts waits for
    ``gate`` (a slow upload; smaller synchronous PUTs pass when ``min_texts`` is above them)."""

    def __init__(self, gate: threading.Event, min_texts: int = 0) -> None:
        from registry.index.embed import HashingEmbedder

        self.inner = HashingEmbedder()
        self.gate = gate
        self.min_texts = min_texts
        self.model_id = self.inner.model_id
        self.dim = self.inner.dim

    def embed_query(self, text):
        return self.inner.embed_query(text)

    def embed_documents(self, texts, batch_size: int = 32):
        if len(texts) >= self.min_texts:
            self.gate.wait(30)
        return self.inner.embed_documents(texts, batch_size)


def _app(settings, bor_policy, embedder=None, **overrides):
    from registry.index.embed import HashingEmbedder
    from service.app import create_app

    app = create_app(
        settings.model_copy(update=overrides),
        embedder_factory=lambda _: embedder or HashingEmbedder(),
        bor_policy=bor_policy,
        background_load=False,
    )
    return TestClient(app, raise_server_exceptions=False)


def _tools(prefix: str, n: int) -> list[dict]:
    return [{"name": f"{prefix}{i}", "description": f"{prefix} does thing number {i}"} for i in range(n)]


def _poll(client, url: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(url)
        assert r.status_code == 200, r.text
        body = r.json()
        if body["state"] not in ("queued", "running") or time.monotonic() > deadline:
            return body
        time.sleep(0.02)


@pytest.fixture
def blocked_refits(monkeypatch):
    """Refits that wait for the returned event (and count how many run at once)."""
    from registry.learning import manager
    from registry.learning.refit import RefitOutcome

    gate = threading.Event()
    running: list[int] = [0, 0]  # now, most at once
    lock = threading.Lock()

    def slow_refit(events, registry, current, **kwargs):
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        gate.wait(30)
        with lock:
            running[0] -= 1
        return RefitOutcome("refused", "blocked test refit", None, {"events": len(list(events))})

    monkeypatch.setattr(manager, "refit", slow_refit)
    return gate, running


# -- item 4: bounded refits --------------------------------------------------------------------


def test_refits_run_one_at_a_time_and_a_full_queue_answers_429(settings, bor_policy, blocked_refits):
    gate, running = blocked_refits
    with _app(settings, bor_policy, refit_queue_max=3) as client:
        for name in ("a", "b", "c", "d"):
            assert client.put(f"/registries/{name}", json=weather_tools()).status_code == 200
        jobs = [client.post(f"/registries/{n}/policies/refit?async=true", headers=JSON) for n in ("a", "b", "c")]
        assert [r.status_code for r in jobs] == [202, 202, 202]
        full = client.post("/registries/d/policies/refit?async=true", headers=JSON)
        assert full.status_code == 429, full.text
        assert int(full.headers["retry-after"]) >= 1
        assert full.json()["error"]["type"] == "too_many_requests"
        assert client.post("/registries/d/policies/refit", headers=JSON).status_code == 429  # synchronous too
        # the same registry again: its queued job, not a new one
        again = client.post("/registries/c/policies/refit?async=true", headers=JSON)
        assert again.status_code == 202 and again.json()["job"] == jobs[2].json()["job"]
        time.sleep(0.3)
        states = [client.get(f"/registries/{n}/policies/refit/{r.json()['job']}").json()["state"]
                  for n, r in zip("abc", jobs)]
        assert states == ["running", "queued", "queued"]
        # queries are answered meanwhile
        assert client.post("/shortlist", json={"registry": "a", "query": "weather"}).status_code == 200
        gate.set()
        finals = [_poll(client, f"/registries/{n}/policies/refit/{r.json()['job']}") for n, r in zip("abc", jobs)]
        assert [f["state"] for f in finals] == ["refused"] * 3
        assert running[1] == 1  # never two at once
        assert client.post("/registries/d/policies/refit?async=true", headers=JSON).status_code == 202


def test_refits_read_only_the_new_lines_of_the_log(settings):
    from registry.feedback import LocalFeedbackLog
    from registry.learning.refit_events import RefitEvents

    log = LocalFeedbackLog.in_data_dir(settings.data_dir, archive=False)
    events = easy_events(300, "w") + easy_events(100, "other")
    for e in events[:250]:
        log.append(e)
    reader = RefitEvents(log)
    assert len(reader.of("w")) == 250 and reader.reads == 250
    for e in events[250:]:
        log.append(e)
    assert len(reader.of("w")) == 300 and reader.reads == 400  # 150 new lines, not 400 again
    assert len(reader.of("other")) == 100 and reader.reads == 400
    assert [e.shortlist_id for e in reader.of("w")] == [
        e.shortlist_id for e in log.replay() if e.registry == "w"
    ]
    # a compaction cuts events: the reader reads the log again and sees what a replay sees
    assert log.compact(time.time() + 1) == 400
    log.append(easy_events(1, "w")[0])
    assert len(reader.of("w")) == 1 and reader.rereads == 1


def test_refits_read_the_redis_stream_incrementally(redis_server, redis_prefix):
    import redis

    from registry.learning.refit_events import RefitEvents
    from registry.store.redis import RedisFeedbackLog

    log = RedisFeedbackLog(redis.Redis.from_url(redis_server.url), redis_prefix)
    for e in easy_events(1200, "w"):
        log.append(e)
    reader = RefitEvents(log)
    assert len(reader.of("w")) == 1200 and reader.reads == 1200
    for e in easy_events(5, "w"):
        log.append(e)
    assert len(reader.of("w")) == 1205 and reader.reads == 1205
    assert log.compact(time.time() + 5) == 1205
    assert reader.of("w") == [] and reader.rereads == 1


# -- item 7: bounded, durable upload jobs ------------------------------------------------------


def test_the_upload_queue_is_bounded_with_429_and_retry_after(settings, bor_policy):
    gate = threading.Event()
    with _app(settings, bor_policy, GatedEmbedder(gate), async_write_min_texts=2, write_queue_max=2) as client:
        first = client.put("/registries/a", json=_tools("a", 5))
        second = client.put("/registries/b", json=_tools("b", 5))
        assert first.status_code == second.status_code == 202
        third = client.put("/registries/c", json=_tools("c", 5))
        assert third.status_code == 429, third.text
        assert int(third.headers["retry-after"]) >= 1 and "retry" in third.json()["error"]["message"]
        gate.set()
        assert _poll(client, first.headers["location"])["state"] == "done"
        assert _poll(client, second.headers["location"])["state"] == "done"
        assert client.get("/registries/c").status_code == 404  # nothing of the refused one
        assert client.put("/registries/c", json=_tools("c", 5)).status_code == 202


def test_an_acknowledged_upload_survives_a_restart_and_completes(settings, bor_policy):
    gate = threading.Event()  # never set: the first process never embeds
    client = _app(settings, bor_policy, GatedEmbedder(gate), async_write_min_texts=2)
    with client:
        accepted = [client.put(f"/registries/r{i}", json=_tools(f"r{i}x", 4)) for i in range(3)]
        assert [r.status_code for r in accepted] == [202] * 3
        # the process "dies" here: its worker is stuck, nothing was committed
        core = client.app.state.service.core
        assert all(core.snapshots.current(f"r{i}") is None for i in range(3))
    with _app(settings, bor_policy, async_write_min_texts=2) as again:
        for i, r in enumerate(accepted):
            done = _poll(again, r.headers["location"])
            assert done["state"] == "done", done
            assert done["result"]["registry"] == f"r{i}" and done["result"]["tools"] == 4
            tools = again.get(f"/registries/r{i}").json()["tools"]
            assert [t["name"] for t in tools] == [f"r{i}x{j}" for j in range(4)]
    gate.set()


def test_a_job_interrupted_while_committing_is_done_or_failed_never_reapplied(settings, bor_policy):
    from registry.job_queue import LocalJobRecords

    records = LocalJobRecords(settings.data_dir)
    with _app(settings, bor_policy, async_write_min_texts=2) as client:
        first = client.put("/registries/r", json=_tools("old", 3))
        assert first.status_code == 202 and _poll(client, first.headers["location"])["state"] == "done"
        version = client.get("/registries/r").json()["version"]
    landed = _tools("old", 3)  # what the registry holds: as if the commit landed, then the crash
    for job_id, payload, before in (
        ("a" * 32, landed, version - 1),  # committed: reported done
        ("b" * 32, _tools("new", 3), version - 1),  # the registry moved on: failed, not applied
        ("c" * 32, _tools("other", 3), version),  # not committed yet: run again
    ):
        record = {"id": job_id, "registry": "r", "kind": "put", "new_texts": 3, "state": "running",
                  "created": time.time(), "before": before}
        records.save("write", record, json.dumps(payload).encode())
    with _app(settings, bor_policy, async_write_min_texts=2) as client:
        a = _poll(client, f"/registries/r/jobs/{'a' * 32}")
        b = _poll(client, f"/registries/r/jobs/{'b' * 32}")
        c = _poll(client, f"/registries/r/jobs/{'c' * 32}")
        assert a["state"] == "done" and a["result"]["version"] == version
        assert b["state"] == "failed" and b["error"]["type"] == "interrupted"
        assert "send it again" in b["error"]["message"]
        assert c["state"] == "done"
        names = [t["name"] for t in client.get("/registries/r").json()["tools"]]
        assert names == ["other0", "other1", "other2"]


def test_refit_jobs_survive_a_restart(settings, bor_policy, blocked_refits):
    gate, _ = blocked_refits
    with _app(settings, bor_policy) as client:
        client.put("/registries/w", json=weather_tools())
        job = client.post("/registries/w/policies/refit?async=true", headers=JSON).json()["job"]
        time.sleep(0.2)
    gate.set()  # the old process's worker ends; the new process runs the job again
    with _app(settings, bor_policy) as client:
        body = _poll(client, f"/registries/w/policies/refit/{job}")
        assert body["state"] == "refused" and body["reason"] == "blocked test refit"
    with _app(settings, bor_policy) as client:  # a finished job is still answered (kept a day)
        assert client.get(f"/registries/w/policies/refit/{job}").json()["state"] == "refused"


def test_a_dead_replicas_jobs_are_resumed_by_another(redis_server, redis_prefix, settings, bor_policy):
    import redis

    from registry.store.redis_job_records import RedisJobRecords

    records = RedisJobRecords(redis.Redis.from_url(redis_server.url), redis_prefix)
    record = {"id": "d" * 32, "registry": "r", "kind": "put", "new_texts": 3, "state": "queued",
              "created": time.time()}
    records.save("write", record, json.dumps(_tools("t", 3)).encode())
    assert records.claim("write", record["id"], "dead-replica", 0.5)  # held by a dead process
    from pydantic import SecretStr

    overrides = {"redis_url": SecretStr(redis_server.url), "redis_prefix": redis_prefix,
                 "async_write_min_texts": 2, "job_lease_seconds": 0.5, "sync_interval_seconds": 0.2}
    with _app(settings, bor_policy, **overrides) as client:
        body = _poll(client, f"/registries/r/jobs/{'d' * 32}")
        assert body["state"] == "done" and body["result"]["tools"] == 3
        assert client.get("/registries/r").json()["version"] == 1
