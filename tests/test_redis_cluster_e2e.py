"""Replicas on a real Redis Cluster, end to end: three masters with a replica each (started
here), two `shortlist serve` processes with the real MiniLM, writes and feedback from both while
the master holding a registry's slot fails over (``CLUSTER FAILOVER`` on its replica), then
while another master loses its data (``FLUSHALL``).

Each registry's keys carry its own hash tag (``{shortlist:reg:<name>}...``) and the
deployment's keys the prefix's (``{shortlist:}...``), so every script and transaction touches
one slot and the registries spread over the masters. What must hold: no 5xx other than 503 (a
write refused while a slot moves is not acknowledged), every acknowledged write and feedback
event present afterwards on both replicas and in the cluster, and version numbers that only grow.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import astuple
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from pydantic import SecretStr

from registry.settings import Settings
from registry.store.redis import RedisFeedbackLog, RedisStore, connect
from tests.redis_cluster import RedisClusterServers
from tests.server import Server, Servers

pytestmark = pytest.mark.e2e

REGISTRIES = ("alpha", "orders")  # their tags hash to slots of different masters
CONVERGE_SECONDS = 10.0


def tools(registry: str, n: int) -> list[dict]:
    return [{"name": f"{registry}_tool_{i}", "description": f"Tool {i} of {registry}: handles task number {i}."}
            for i in range(n)]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path) -> Iterator[tuple[RedisClusterServers, Server, Server]]:
    base = tmp_path_factory.mktemp("cluster")
    cluster = RedisClusterServers(base / "redis").start()
    servers = Servers(base, minilm_cache)
    try:
        a, b = (servers.start(wait=False, data_dir=base / name, redis_url=cluster.url,
                              async_write_min_texts="1000000") for name in ("a", "b"))
        a.wait_ready()
        b.wait_ready()
        yield cluster, a, b
    finally:
        servers.close()
        cluster.stop()


class Direct(NamedTuple):
    """The test's own view of the cluster, beside the replicas': a store, its client, the prefix."""

    store: RedisStore
    client: Any
    prefix: str


@pytest.fixture
def direct(deployment: tuple[RedisClusterServers, Server, Server]) -> Iterator[Direct]:
    """A :class:`Direct` on the deployment's cluster and key prefix, closed after the test."""
    cluster = deployment[0]
    prefix = Settings(redis_url=SecretStr(cluster.url)).redis_key_prefix()
    client = connect(cluster.url)
    store = RedisStore(client, prefix)
    try:
        yield Direct(store, client, prefix)
    finally:
        store.close()


class Traffic:
    """Writes and feedback from both replicas on a thread; remembers what was acknowledged."""

    def __init__(self, a: Server, b: Server) -> None:
        self.replicas = (a, b)
        self.acked: dict[str, tuple[int, list[str]]] = {}  # registry -> last acked (version, names)
        self.versions: dict[str, list[int]] = {r: [] for r in REGISTRIES}
        self.feedback: set[str] = set()  # acknowledged shortlist ids
        self.statuses: dict[int, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def note(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def run(self) -> None:
        with httpx.Client(timeout=30) as http:
            for i in itertools.count():
                if self.stop.is_set():
                    return
                server = self.replicas[i % 2]
                registry = REGISTRIES[i % len(REGISTRIES)]
                body = tools(registry, 3 + i % 4)
                r = http.put(f"{server.url}/registries/{registry}", json=body)
                self.note(r.status_code)
                if r.status_code == 200:
                    version = r.json()["version"]
                    self.versions[registry].append(version)
                    self.acked[registry] = (version, [t["name"] for t in body])
                s = http.post(f"{server.url}/shortlist", json={"registry": registry, "query": "task number 1", "k": 2})
                self.note(s.status_code)
                if s.status_code == 200:
                    other = self.replicas[(i + 1) % 2]  # feedback reaches the other replica
                    f = http.post(f"{other.url}/feedback", json={"shortlist_id": s.json()["shortlist_id"],
                                                                  "used": [s.json()["tools"][0]["name"]]})
                    self.note(f.status_code)
                    if f.status_code == 200:
                        self.feedback.add(s.json()["shortlist_id"])


def check(cluster: RedisClusterServers, traffic: Traffic, a: Server, b: Server, prefix: str) -> None:
    """No 5xx but 503, versions acknowledged once each and growing, and every acknowledged write
    and feedback event in the cluster and served by both replicas."""
    assert all(s < 500 or s == 503 for s in traffic.statuses), traffic.statuses
    for registry in REGISTRIES:
        seen = traffic.versions[registry]
        assert seen == sorted(set(seen)), f"{registry}: a version number was acknowledged twice: {seen}"
    store = RedisStore(connect(cluster.url), prefix)
    deadline = time.monotonic() + CONVERGE_SECONDS
    for registry, (version, names) in traffic.acked.items():
        record = store.load(registry)
        assert record is not None and record.version == version
        assert [t["name"] for t in record.tools] == names
        for server in (a, b):
            while httpx.get(f"{server.url}/registries/{registry}").json().get("version") != version:
                assert time.monotonic() < deadline, f"{server.url} does not serve {registry} v{version}"
                time.sleep(0.1)
            served = httpx.get(f"{server.url}/registries/{registry}").json()
            assert [t["name"] for t in served["tools"]] == names
    # every acknowledged feedback event is in the shared stream
    logged = {event.shortlist_id for event in RedisFeedbackLog(connect(cluster.url), prefix).replay()}
    assert traffic.feedback and traffic.feedback <= logged
    store.close()


def run_traffic(a: Server, b: Server, fault: Callable[[], object], before: float = 3, after: float = 4) -> Traffic:
    traffic = Traffic(a, b)
    traffic.thread.start()
    time.sleep(before)  # writes under way before the fault
    acked_before = sum(traffic.statuses.get(s, 0) for s in (200, 204))
    fault()
    time.sleep(after)  # and after it
    traffic.stop.set()
    traffic.thread.join(60)
    assert sum(traffic.statuses.get(s, 0) for s in (200, 204)) > acked_before
    return traffic


def test_two_replicas_on_a_redis_cluster_lose_nothing_acknowledged_across_a_failover(deployment, direct) -> None:
    cluster, a, b = deployment
    store, prefix = direct.store, direct.prefix
    assert prefix == "{shortlist:}"
    alpha = store._keys_of("alpha").epoch
    moved: list[tuple[int, int]] = []
    traffic = run_traffic(a, b, lambda: moved.append(tuple(n.port for n in cluster.failover(alpha))))
    old, new = moved[0]
    assert old != new and cluster.node_for(alpha).port == new
    print(f"statuses {traffic.statuses}, failover {old} -> {new}, "
          f"versions {[len(v) for v in traffic.versions.values()]}, feedback {len(traffic.feedback)}")
    check(cluster, traffic, a, b, prefix)


def test_each_registry_has_its_own_slot_and_a_master_that_loses_one_gets_it_back(deployment, direct) -> None:
    cluster, a, b = deployment
    store, client, prefix = direct
    for registry in REGISTRIES:  # written by the failover test, or now
        if store.version(registry) is None:
            assert httpx.put(f"{a.url}/registries/{registry}", json=tools(registry, 3)).status_code == 200
    slots = {name: {int(client.cluster_keyslot(key)) for key in astuple(store._keys_of(name))}
             for name in REGISTRIES}
    slots["(deployment)"] = {int(client.cluster_keyslot(prefix + k)) for k in ("epoch", "names", "feedback")}
    assert all(len(s) == 1 for s in slots.values()), slots  # each one's scripts touch one slot
    masters = {name: cluster.node_for(store._keys_of(name).epoch).port for name in REGISTRIES}
    masters["(deployment)"] = cluster.node_for(prefix + "epoch").port
    assert len(set(masters.values())) == 3, masters  # alpha, orders and the deployment: 3 masters
    keys = {port: sum(1 for _ in next(n for n in cluster.nodes if n.port == port).client().scan_iter())
            for port in set(masters.values())}
    print(f"slots {slots}, masters {masters}, keys per master {keys}")
    assert all(keys.values())

    # the master holding "orders" loses its data: the replicas write it back, alpha is untouched
    orders_master = next(n for n in cluster.nodes if n.port == masters["orders"])
    last = store.version("orders")
    assert last is not None
    traffic = run_traffic(a, b, orders_master.client().flushall)
    print(f"statuses {traffic.statuses}, versions {[len(v) for v in traffic.versions.values()]}")
    assert traffic.versions["orders"] and traffic.versions["orders"][0] > last  # numbers never reused
    logs = a.log_path.read_text() + b.log_path.read_text()
    assert "registry 'orders': its Redis Cluster slot lost its data" in logs  # written back, not re-created
    assert "registry 'alpha': its Redis Cluster slot" not in logs
    check(cluster, traffic, a, b, prefix)


def test_looking_up_a_registry_never_created_leaves_no_key_behind(deployment, direct) -> None:
    _, a, _ = deployment
    store, client, prefix = direct
    assert httpx.get(f"{a.url}/registries/never-made").status_code == 404
    assert store.load("never-made") is None and store.version("never-made") is None
    assert store.delete("never-made") is False
    assert b"never-made" not in client.smembers(prefix + "names")
    assert not any(client.exists(key) for key in astuple(store._keys_of("never-made")))
