"""Replicas on a real Redis Cluster, end to end: three masters with a replica each (started
here), two `shortlist serve` processes with the real MiniLM, writes and feedback from both while
the master holding the deployment's slot fails over (``CLUSTER FAILOVER`` on its replica).

Every key carries the prefix as a hash tag (``{shortlist:}...``), so every script and
transaction touches one slot. What must hold: no 5xx other than 503 (a write refused while
the slot moves is not acknowledged), every acknowledged write and feedback event present
afterwards on both replicas and in the cluster, and version numbers that only grow.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from registry.settings import Settings
from registry.store.redis import RedisFeedbackLog, RedisStore, connect
from tests.redis_cluster import RedisClusterServers
from tests.server import Server, Servers

pytestmark = pytest.mark.e2e

REGISTRIES = ("alpha", "beta")
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


def test_two_replicas_on_a_redis_cluster_lose_nothing_acknowledged_across_a_failover(deployment) -> None:
    cluster, a, b = deployment
    settings = Settings(redis_url=cluster.url)
    prefix = settings.redis_key_prefix()
    assert prefix == "{shortlist:}"
    traffic = Traffic(a, b)
    traffic.thread.start()
    time.sleep(3)  # writes under way before the failover
    before = dict(traffic.statuses)
    old, new = cluster.failover(prefix + "registries")
    assert (old.port, new.port) != (new.port, old.port) and cluster.node_for(prefix + "epoch").port == new.port
    time.sleep(4)  # and after it
    traffic.stop.set()
    traffic.thread.join(60)
    assert sum(traffic.statuses.get(s, 0) for s in (200, 204)) > sum(before.get(s, 0) for s in (200, 204))
    print(f"statuses {traffic.statuses}, failover {old.port} -> {new.port}, "
          f"versions {[len(v) for v in traffic.versions.values()]}, feedback {len(traffic.feedback)}")
    assert all(s < 500 or s == 503 for s in traffic.statuses), traffic.statuses
    for registry in REGISTRIES:
        seen = traffic.versions[registry]
        assert seen == sorted(set(seen)), f"{registry}: a version number was acknowledged twice: {seen}"

    # every acknowledged write: the newest is served by both replicas and stored in the cluster
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
