"""Replicas sharing one Redis, end to end: real `shortlist serve` processes, the real MiniLM, a
real `redis-server` started here (append-only, so it can be killed and restarted with its data).

One story runs in order against the same two replicas A and B (each step builds on the state
the previous one left: registry versions, feedback events), as one test: pytest-xdist may send
a module's tests to different workers, each with a cluster of its own (and its group mark does
not hold with pytest 9). The compaction test stands alone.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from registry.store.redis import RedisStore, connect
from tests.conftest import ROOT
from tests.redis_server import RedisServer
from tests.server import Server, Servers

pytestmark = pytest.mark.e2e

REPLICATION_SECONDS = 2.0
QUERIES = [
    "What's the weather like in Paris right now?",
    "convert 100 dollars to euros",
    "email the quarterly report to bob@example.com",
    "book me a flight from JFK to LAX next friday",
    "open a GitHub issue about the login crash",
]


@dataclass
class Cluster:
    redis: RedisServer
    servers: Servers
    a: Server
    b: Server
    base: Path

    def replica(self, name: str, wait: bool = True) -> Server:
        # Uploads stay synchronous (no 202 job), so a kill lands in the middle of a request.
        return self.servers.start(
            wait=wait, data_dir=self.base / name, redis_url=self.redis.url,
            async_write_min_texts="1000000",
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("replicas")
    redis = RedisServer(base / "redis", appendonly=True).start()
    servers = Servers(base, minilm_cache)
    cluster = Cluster(redis, servers, None, None, base)  # type: ignore[arg-type]
    try:
        cluster.a = cluster.replica("a", wait=False)
        cluster.b = cluster.replica("b", wait=False)
        cluster.a.wait_ready()
        cluster.b.wait_ready()
        yield cluster
    finally:
        servers.close()
        redis.stop()


def demo_tools() -> list[dict]:
    return json.loads((ROOT / "examples" / "demo_tools.json").read_text())["tools"]


def versions(server: Server) -> dict[str, int]:
    body = httpx.get(f"{server.url}/registries", timeout=5).json()
    return {r["registry"]: r["version"] for r in body["registries"]}


def wait_for(server: Server, registry: str, version: int | None, since: float) -> float:
    """Seconds from ``since`` until ``server`` serves ``version`` of ``registry`` (None: gone)."""
    while versions(server).get(registry) != version:
        assert time.monotonic() - since < REPLICATION_SECONDS, (
            f"{server.url} still serves {versions(server).get(registry)} of {registry!r}"
        )
        time.sleep(0.01)
    return time.monotonic() - since


def shortlist(server: Server, query: str, registry: str = "e2e") -> dict:
    r = httpx.post(f"{server.url}/shortlist", json={"registry": registry, "query": query}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def ranked(server: Server, registry: str = "e2e") -> dict[str, list[tuple[str, float]]]:
    return {
        q: [(t["name"], round(t["score"], 5)) for t in shortlist(server, q, registry)["tools"]]
        for q in QUERIES
    }


def gauge(server: Server, name: str) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise KeyError(name)


def step_a_write_on_one_replica_is_served_by_the_other_within_2s(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    r = httpx.put(f"{a.url}/registries/e2e", json=demo_tools(), timeout=60)
    assert r.status_code == 200, r.text
    wait_for(b, "e2e", 1, time.monotonic())
    assert ranked(b) == ranked(a)

    extra = {"name": "order_pizza", "description": "Order a pizza for delivery to an address.",
             "parameters": {"type": "object", "properties": {"address": {"type": "string"}}}}
    r = httpx.post(f"{b.url}/registries/e2e/tools", json=[extra], timeout=60)
    assert r.status_code == 200 and r.json()["version"] == 2
    wait_for(a, "e2e", 2, time.monotonic())
    assert shortlist(a, "order a margherita pizza to my home")["tools"][0]["name"] == "order_pizza"
    assert ranked(a) == ranked(b)

    assert httpx.delete(f"{a.url}/registries/e2e/tools/order_pizza").status_code == 204
    wait_for(b, "e2e", 3, time.monotonic())
    httpx.put(f"{a.url}/registries/scratch", json=demo_tools()[:3], timeout=60).raise_for_status()
    wait_for(b, "scratch", 1, time.monotonic())
    assert httpx.delete(f"{b.url}/registries/scratch").status_code == 204
    wait_for(a, "scratch", None, time.monotonic())
    assert gauge(a, "shortlist_store_up") == 1.0


def step_feedback_reaches_any_replica_and_resends_are_caught_across_replicas(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    served = shortlist(a, QUERIES[0])
    used = served["tools"][0]["name"]
    body = {"shortlist_id": served["shortlist_id"], "used": [used]}
    first = httpx.post(f"{b.url}/feedback", json=body)
    assert first.status_code == 200 and first.json()["duplicate"] is False, first.text
    again = httpx.post(f"{a.url}/feedback", json=body)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    # Both replicas come to report the same numbers: A tails the shared stream, and its
    # learner folds the event in the background, so the learning section may lag a tick.
    started = time.monotonic()
    while True:
        seen_a = httpx.get(f"{a.url}/registries/e2e/report").json()
        seen_b = httpx.get(f"{b.url}/registries/e2e/report").json()
        if seen_a["events"] == 1 and seen_a == seen_b:
            break
        assert time.monotonic() - started < REPLICATION_SECONDS, (seen_a, seen_b)
        time.sleep(0.02)
    assert seen_a["learning"]["events"] == 1


def step_a_fresh_replica_loads_everything_and_sigkill_mid_upload_tears_nothing(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    fresh = cluster.replica("fresh")  # an empty data dir: everything comes from Redis
    assert versions(fresh) == versions(a) == {"e2e": 3}
    # Registries are loaded before ready; the usage memory learned from earlier feedback is
    # folded from the shared stream just after, so the rankings agree within a sync tick or two.
    started = time.monotonic()
    while ranked(fresh) != ranked(a):
        assert time.monotonic() - started < REPLICATION_SECONDS, (ranked(fresh), ranked(a))
        time.sleep(0.1)

    before = httpx.get(f"{b.url}/registries/e2e").json()
    # New texts, so the upload spends seconds embedding: the kill lands while it is in flight.
    big = [
        {"name": f"bulk_tool_{i}", "description": f"Bulk operation number {i} on ledger {i * 7919 % 1000}.",
         "parameters": {"type": "object", "properties": {"item": {"type": "string"}}}}
        for i in range(1500)
    ]
    outcome: dict[str, object] = {}

    def upload() -> None:
        try:
            outcome["response"] = httpx.put(f"{fresh.url}/registries/e2e", json=big, timeout=120)
        except httpx.TransportError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=upload)
    thread.start()
    time.sleep(1.0)
    fresh.stop(signal.SIGKILL)
    thread.join(30)
    assert "error" in outcome, "the upload finished before the kill; make it larger"

    time.sleep(REPLICATION_SECONDS)  # had the write landed, B would serve it by now
    after = httpx.get(f"{b.url}/registries/e2e").json()
    stored = RedisStore(connect(cluster.redis.url)).load("e2e")
    assert stored is not None
    # Old or new, never a mix: B serves exactly what Redis holds, and it is complete.
    assert after["version"] == stored.version and after["tools"] == stored.tools
    if after["version"] == before["version"]:
        assert after == before
    else:
        assert after["version"] == before["version"] + 1 and after["tools"] == big
    assert shortlist(b, QUERIES[0])["version"] == after["version"]


def step_redis_outage_then_recovery_without_restart(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    before = {s.url: ranked(s) for s in (a, b)}
    remembered = shortlist(a, QUERIES[1])
    statuses: list[int] = []

    cluster.redis.stop()  # SIGKILL; the append-only file keeps every acknowledged write
    try:
        for server in (a, b):
            deadline = time.monotonic() + 3
            while gauge(server, "shortlist_store_up") != 0.0:
                assert time.monotonic() < deadline, "shortlist_store_up did not drop to 0"
                time.sleep(0.05)
        for server in (a, b):
            assert ranked(server) == before[server.url]  # queries answered from memory
            assert httpx.get(f"{server.url}/readyz").status_code == 200
            assert httpx.get(f"{server.url}/registries").status_code == 200

            put = httpx.put(f"{server.url}/registries/e2e", json=demo_tools(), timeout=30)
            statuses.append(put.status_code)
            assert put.status_code == 503, put.text
            error = put.json()["error"]
            assert error["type"] == "unavailable" and "store" in error["message"]
            assert "unavailable" in error["message"]

            fb = httpx.post(f"{server.url}/feedback",
                            json={"shortlist_id": remembered["shortlist_id"], "used": ["get_weather"]})
            statuses.append(fb.status_code)
            assert fb.status_code == 503 and "unavailable" in fb.json()["error"]["message"], fb.text
            served_now = shortlist(server, QUERIES[2])
            fb = httpx.post(f"{server.url}/feedback",
                            json={"shortlist_id": served_now["shortlist_id"], "used": ["send_email"]})
            statuses.append(fb.status_code)
            assert fb.status_code == 503, fb.text
            statuses.append(httpx.delete(f"{server.url}/registries/e2e").status_code)
            statuses.append(
                httpx.post(f"{server.url}/registries/e2e/tools", json=demo_tools()[:1]).status_code
            )
        assert set(statuses) == {503}
    finally:
        if not cluster.redis.running:
            cluster.redis.start()

    # Back with its data: both replicas reconnect and resynchronise by themselves.
    for server in (a, b):
        deadline = time.monotonic() + 5
        while gauge(server, "shortlist_store_up") != 1.0:
            assert time.monotonic() < deadline, "shortlist_store_up did not return to 1"
            time.sleep(0.05)
    assert versions(a) == versions(b) == {"e2e": versions(a)["e2e"]}
    current = versions(a)["e2e"]
    r = httpx.put(f"{b.url}/registries/e2e", json=demo_tools(), timeout=60)
    assert r.status_code == 200 and r.json()["version"] == current + 1, r.text
    wait_for(a, "e2e", current + 1, time.monotonic())
    assert ranked(a) == ranked(b)
    # The shortlist remembered before the outage accepts its feedback now.
    fb = httpx.post(f"{b.url}/feedback",
                    json={"shortlist_id": remembered["shortlist_id"], "used": ["convert_currency"]})
    assert fb.status_code == 200 and fb.json()["duplicate"] is False, fb.text


def test_replicas_share_writes_feedback_a_fresh_replica_and_a_redis_outage(cluster: Cluster) -> None:
    """The ordered story: each step starts from the state the one before left."""
    step_a_write_on_one_replica_is_served_by_the_other_within_2s(cluster)
    step_feedback_reaches_any_replica_and_resends_are_caught_across_replicas(cluster)
    step_a_fresh_replica_loads_everything_and_sigkill_mid_upload_tears_nothing(cluster)
    step_redis_outage_then_recovery_without_restart(cluster)


def test_replicas_compact_the_shared_feedback_stream_and_agree(cluster: Cluster) -> None:
    """Two replicas with tiny compaction thresholds on their own key prefix: the sync thread
    compacts the stream, both keep reporting the same efficiency, and a replica started after
    the compaction restores the same report from checkpoint + stream."""
    settings: dict[str, Any] = dict(redis_prefix="compaction:", feedback_compact_events="3",
                    feedback_compact_interval_seconds="0", feedback_compact_margin_seconds="0",
                    live_window_seconds="1")
    a = cluster.servers.start(data_dir=cluster.base / "ca", redis_url=cluster.redis.url, **settings)
    b = cluster.servers.start(data_dir=cluster.base / "cb", redis_url=cluster.redis.url, **settings)
    httpx.put(f"{a.url}/registries/c", json=demo_tools()).raise_for_status()
    wait_for(b, "c", 1, time.monotonic())
    for i in range(10):
        server = (a, b)[i % 2]
        served = shortlist(server, QUERIES[i % len(QUERIES)], registry="c")
        body = {"shortlist_id": served["shortlist_id"], "used": [served["tools"][0]["name"]],
                "calls": [{"tool": served["tools"][0]["name"], "useful": i % 3 != 0}]}
        httpx.post(f"{server.url}/feedback", json=body).raise_for_status()
    time.sleep(1.2)  # all ten leave the 1 s window: compactable
    client = connect(cluster.redis.url)
    started = time.monotonic()
    while client.get("compaction:feedback:checkpoint") is None:
        assert time.monotonic() - started < 10, "no compaction"
        shortlist(a, QUERIES[0], registry="c")  # keep the replicas ticking
        time.sleep(0.1)
    started = time.monotonic()
    while True:  # both replicas have tailed every event
        reports = [httpx.get(f"{s.url}/registries/c/report").json() for s in (a, b)]
        if reports[0] == reports[1] and reports[0]["events"] == 10:
            break
        assert time.monotonic() - started < REPLICATION_SECONDS, reports
        time.sleep(0.05)
    assert client.xlen("compaction:feedback") < 10
    fresh = cluster.servers.start(data_dir=cluster.base / "cc", redis_url=cluster.redis.url, **settings)
    assert httpx.get(f"{fresh.url}/registries/c/report").json() == reports[0]
