"""An acknowledged 202 upload never undoes a write acknowledged after it: the job ends
``superseded`` and commits nothing; a DELETE cancels the registry's queued jobs. Local and
real Redis, and across a restart (the resumed job checks its mark too)."""

from __future__ import annotations

import threading

import pytest
from pydantic import SecretStr

from tests.test_jobs import GatedEmbedder, _app, _poll, _tools


def big_batch_gate(gate: threading.Event) -> GatedEmbedder:
    """The gated fake embedder that holds only the large upload (4+ texts), not small PUTs."""
    return GatedEmbedder(gate, min_texts=4)


def _names(client, registry: str) -> list[str]:
    return [t["name"] for t in client.get(f"/registries/{registry}").json()["tools"]]


@pytest.fixture
def redis_overrides(redis_server, redis_prefix) -> dict:
    return {"redis_url": SecretStr(redis_server.url), "redis_prefix": redis_prefix,
            "sync_interval_seconds": 0.2}


@pytest.mark.parametrize("mode", ["local", "redis"])
def test_put_202_then_delete_then_put_200_ends_with_the_last_put(mode, settings, bor_policy, request):
    overrides = request.getfixturevalue("redis_overrides") if mode == "redis" else {}
    gate = threading.Event()
    with _app(settings, bor_policy, big_batch_gate(gate), async_write_min_texts=2, **overrides) as client:
        big = client.put("/registries/r", json=_tools("big", 40))
        assert big.status_code == 202
        deleted = client.delete("/registries/r")  # exists only as a queued job: cancelled
        assert deleted.status_code == 204, deleted.text
        small = client.put("/registries/r", json=_tools("small", 2))
        assert small.status_code == 200 and small.json()["tools"] == 2
        gate.set()
        job = _poll(client, big.headers["location"])
        assert job["state"] == "superseded", job
        assert job["error"]["type"] == "superseded" and "deleted" in job["error"]["message"]
        assert job["result"] is None
        assert _names(client, "r") == ["small0", "small1"]
        assert client.delete("/registries/none").status_code == 404  # nothing queued: still 404


@pytest.mark.parametrize("mode", ["local", "redis"])
def test_a_later_synchronous_put_supersedes_a_running_upload(mode, settings, bor_policy, request):
    overrides = request.getfixturevalue("redis_overrides") if mode == "redis" else {}
    gate = threading.Event()
    with _app(settings, bor_policy, big_batch_gate(gate), async_write_min_texts=2, **overrides) as client:
        assert client.put("/registries/r", json=_tools("first", 2)).status_code == 200
        big = client.put("/registries/r", json=_tools("big", 40))
        assert big.status_code == 202
        assert _poll_state(client, big.headers["location"], "running")
        later = client.put("/registries/r", json=_tools("later", 2))  # acknowledged after the 202
        assert later.status_code == 200, later.text
        gate.set()  # the job's embedding ends; its commit must find its mark
        job = _poll(client, big.headers["location"])
        assert job["state"] == "superseded", job
        assert "later write" in job["error"]["message"]
        assert _names(client, "r") == ["later0", "later1"]


def test_two_uploads_in_a_row_both_apply_in_order(settings, bor_policy):
    with _app(settings, bor_policy, async_write_min_texts=2) as client:
        first = client.put("/registries/r", json=_tools("one", 5))
        second = client.put("/registries/r", json=_tools("two", 5))
        assert first.status_code == second.status_code == 202
        assert _poll(client, first.headers["location"])["state"] == "done"
        assert _poll(client, second.headers["location"])["state"] == "done"
        assert _names(client, "r") == [f"two{i}" for i in range(5)]


@pytest.mark.parametrize("mode", ["local", "redis"])
def test_a_resumed_upload_checks_for_later_writes_after_a_restart(mode, settings, bor_policy, request):
    # Redis: the dead process's lease on the job runs out, then the new one claims it
    overrides = {**request.getfixturevalue("redis_overrides"), "job_lease_seconds": 0.5} if mode == "redis" else {}
    stuck = threading.Event()  # the first process never embeds: it "dies" with the job queued
    with _app(settings, bor_policy, big_batch_gate(stuck), async_write_min_texts=2, **overrides) as client:
        big = client.put("/registries/r", json=_tools("big", 40))
        assert big.status_code == 202
    gate = threading.Event()
    with _app(settings, bor_policy, big_batch_gate(gate), async_write_min_texts=2, **overrides) as client:
        assert _poll_state(client, big.headers["location"], "running")  # resumed
        after = client.put("/registries/r", json=_tools("after", 2))  # sent after the restart
        assert after.status_code == 200
        gate.set()
        job = _poll(client, big.headers["location"])
        assert job["state"] == "superseded", job
        assert _names(client, "r") == ["after0", "after1"]
    stuck.set()


@pytest.mark.parametrize("mode", ["local", "redis"])
def test_a_delete_before_a_crash_still_cancels_the_resumed_upload(mode, settings, bor_policy, request):
    overrides = {**request.getfixturevalue("redis_overrides"), "job_lease_seconds": 0.5} if mode == "redis" else {}
    stuck = threading.Event()
    with _app(settings, bor_policy, big_batch_gate(stuck), async_write_min_texts=2, **overrides) as client:
        big = client.put("/registries/r", json=_tools("big", 40))
        assert big.status_code == 202
        assert client.delete("/registries/r").status_code == 204
        assert client.put("/registries/r", json=_tools("small", 2)).status_code == 200
    with _app(settings, bor_policy, async_write_min_texts=2, **overrides) as client:
        job = _poll(client, big.headers["location"])
        assert job["state"] == "superseded", job
        assert _names(client, "r") == ["small0", "small1"]
    stuck.set()


def _poll_state(client, url: str, state: str, timeout: float = 30) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get(url).json()["state"] == state:
            return True
        time.sleep(0.02)
    return False


def test_the_python_client_raises_a_conflict_for_a_superseded_upload(settings, bor_policy):
    from tool_shortlist_client import ShortlistClient
    from tool_shortlist_client.errors import ConflictError

    gate = threading.Event()
    with _app(settings, bor_policy, big_batch_gate(gate), async_write_min_texts=2) as http:
        client = ShortlistClient("http://testserver", http_client=http)
        outcome: dict = {}

        def upload() -> None:
            try:
                client.put_registry("r", _tools("big", 40))
            except ConflictError as exc:
                outcome["error"] = exc

        waiting = threading.Thread(target=upload)
        waiting.start()  # 202, then polls
        assert _poll_state(http, _first_job_url(http), "running")
        assert client.put_registry("r", _tools("later", 2)).tools == 2
        gate.set()
        waiting.join(30)
        assert not waiting.is_alive()
        assert outcome["error"].error_type == "superseded"


def _first_job_url(client, timeout: float = 30) -> str:
    """The URL of the one write job the app holds (the client's 202 is not visible here)."""
    import time

    deadline = time.monotonic() + timeout
    core = client.app.state.service.core
    while time.monotonic() < deadline:
        held = core.write_jobs.queue.open_records()
        if held:
            return f"/registries/{held[0]['registry']}/jobs/{held[0]['id']}"
        time.sleep(0.02)
    raise AssertionError("no job accepted")


@pytest.mark.e2e
def test_on_a_real_server_a_delete_and_a_later_put_outlive_an_earlier_upload(server_factory):
    """The README's way (a real server, the real MiniLM): PUT of 600 new tools -> 202, DELETE ->
    204, PUT of 3 tools -> 200; the upload ends superseded and the 3-tool registry stays, also
    after a restart on the same data dir."""
    import httpx

    server = server_factory(async_write_min_texts="50")
    with httpx.Client(base_url=server.url, timeout=60) as client:
        big = client.put("/registries/r", json=_tools("bulk", 600))
        assert big.status_code == 202, big.text
        assert client.delete("/registries/r").status_code == 204
        small = client.put("/registries/r", json=_tools("kept", 3))
        assert small.status_code == 200, small.text
        version = small.json()["version"]
        job = _poll(client, big.headers["location"], timeout=120)
        assert job["state"] == "superseded", job
        registry = client.get("/registries/r").json()
        assert registry["version"] == version
        assert sorted(t["name"] for t in registry["tools"]) == ["kept0", "kept1", "kept2"]
    server.stop()
    again = server_factory()
    with httpx.Client(base_url=again.url, timeout=60) as client:
        assert sorted(t["name"] for t in client.get("/registries/r").json()["tools"]) == [
            "kept0", "kept1", "kept2",
        ]
