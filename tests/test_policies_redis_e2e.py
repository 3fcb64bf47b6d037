"""A refit activated on two replicas sharing a real Redis: real `shortlist serve` processes with
the real MiniLM, a simulated agent's feedback through HTTP, the refit on one replica, the new
policy_version served (and counted in /metrics) by both; a rollback on the other reaches both."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from tests.redis_server import RedisServer
from tests.server import Server, Servers

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path) -> Iterator[tuple[Server, Server]]:
    base = tmp_path_factory.mktemp("policy-replicas")
    redis = RedisServer(base / "redis").start()
    servers = Servers(base, minilm_cache)
    try:
        common = {"redis_url": redis.url, "refit_min_events": "40", "explore_share": "0.2"}
        a = servers.start(wait=False, data_dir=base / "a", **common)
        b = servers.start(wait=False, data_dir=base / "b", **common)
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        servers.close()
        redis.stop()


def _serving(server: Server, query: dict) -> str:
    return str(httpx.post(f"{server.url}/shortlist", json=query, timeout=10).json()["policy_version"])


def _wait_serving(server: Server, query: dict, version: str, timeout: float = 15.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if _serving(server, query) == version:
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"{server.url} never served {version!r}")


def test_refit_is_activated_on_both_replicas(replicas):
    a, b = replicas
    tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())["tools"]
    assert httpx.put(f"{a.url}/registries/demo", json={"tools": tools}, timeout=60).status_code in (200, 201)
    query = {"registry": "demo", "query": "send an email to bob"}
    _wait_serving(b, query, "default", timeout=30)
    described = [t for t in tools if t.get("description")]
    # A simulated agent on both replicas asks for long lists (depth_bias 2 bits) and always
    # uses the first tool shown: the depth past it is wasted, a rule that cuts it finds as much.
    events = 0
    for i in range(90):
        server = (a, b)[i % 2]
        text = described[i % len(described)]["description"].lower().rstrip(".")
        ask = {"registry": "demo", "query": f"please {text}", "depth_bias": 2.0}
        served = httpx.post(f"{server.url}/shortlist", json=ask, timeout=10).json()
        assert served["policy_version"] == "default"
        r = httpx.post(
            f"{server.url}/feedback",
            json={"shortlist_id": served["shortlist_id"], "used": [served["tools"][0]["name"]]},
            timeout=10,
        )
        events += r.status_code == 200
    assert events == 90
    job = httpx.post(f"{a.url}/registries/demo/policies/refit?async=true", json={}, timeout=10)
    assert job.status_code == 202
    job_id = job.json()["job"]
    for _ in range(300):  # any replica answers the poll (jobs are kept in Redis)
        state = httpx.get(f"{b.url}/registries/demo/policies/refit/{job_id}", timeout=10).json()
        if state["state"] not in ("queued", "running"):
            break
        time.sleep(0.1)
    # the rule cuts mean K by far more than SHORTLIST_REFIT_REVIEW_FACTOR: it is kept as a
    # candidate, and neither replica serves it until an admin activates it
    assert state["state"] == "candidate", json.dumps(state)
    assert state["version"] == "refit-1"
    est = state["estimate"]
    assert est["candidate"]["found"] >= est["current"]["found"]
    assert est["candidate"]["mean_k"] < est["current"]["mean_k"]
    assert _serving(a, query) == _serving(b, query) == "default"
    r = httpx.post(f"{a.url}/registries/demo/policies/refit-1/activate", json={}, timeout=10)
    assert r.status_code == 200 and r.json()["active"] == "refit-1", r.text
    # both replicas serve it (b through its poll of the policy epoch)
    assert _serving(a, query) == "refit-1"
    _wait_serving(b, query, "refit-1")
    listing = httpx.get(f"{b.url}/registries/demo/policies", timeout=10).json()
    assert listing["active"] == listing["serving"] == "refit-1"
    metrics = httpx.get(f"{b.url}/metrics", timeout=10).text
    assert 'shortlist_policy_requests_total{policy_version="refit-1",registry="demo"}' in metrics
    # roll back from the other replica: both serve the default again
    r = httpx.post(f"{b.url}/registries/demo/policies/default/activate", json={}, timeout=10)
    assert r.status_code == 200 and r.json()["active"] == "default"
    _wait_serving(a, query, "default")
    assert _serving(b, query) == "default"
