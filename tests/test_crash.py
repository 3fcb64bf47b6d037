"""Crash safety: SIGKILL at random moments never loses an acknowledged write or tears a registry.

Two levels. The local store, written in a loop by a child process that is killed mid-write; and
the real server (real MiniLM), fed uploads, upserts and deletes while it is killed and restarted.
Kill moments come from a seeded RNG, so a failure replays the same schedule.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import ROOT

SEED = 20240611
REGISTRY = "crash"


# -- the local store under SIGKILL ---------------------------------------------------------------


def store_tools(version: int) -> list[dict[str, Any]]:
    """The tools of version ``version``: from one tool to ~2 MB of JSON, so kills land mid-write."""
    count = 1 + (version * 7919) % 1000
    return [
        {
            "name": f"v{version}_t{i}",
            "description": f"tool {i} of version {version} " + "x" * ((version + i) % 2000),
            "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}},
        }
        for i in range(count)
    ]


def store_vector(version: int) -> np.ndarray:
    return np.full(8, version, dtype=np.float32)


def store_hash(version: int) -> str:
    return f"{version:064x}"


def store_writer(root: str) -> None:
    """Child process: save version after version; print each version once save() returned."""
    from registry.store.base import RegistryRecord
    from registry.store.local import LocalStore

    store = LocalStore(Path(root))
    current = store.load(REGISTRY)
    version = current.version if current else 0
    while True:
        version += 1
        tools = store_tools(version)
        store.save(RegistryRecord(REGISTRY, version, tools, [[tools[0]["name"]]]))
        store.put_embeddings("model", {store_hash(version): store_vector(version)})
        print(version, flush=True)


def _read_acks(proc: subprocess.Popen[str], acks: list[int]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.endswith("\n"):  # a line cut by the kill was never acknowledged
            acks.append(int(line))


def test_local_store_keeps_the_newest_acknowledged_version_under_sigkill(tmp_path: Path) -> None:
    from registry.store.local import LocalStore

    rng = random.Random(SEED)
    root = tmp_path / "store"
    last_acked = 0
    every_acked: set[int] = set()
    code = f"from tests.test_crash import store_writer; store_writer({str(root)!r})"
    for cycle in range(8):
        proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        acks: list[int] = []
        reader = threading.Thread(target=_read_acks, args=(proc, acks), daemon=True)
        reader.start()
        deadline = time.monotonic() + 30
        while not acks and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)  # writing has begun: from here on every moment is mid-write
        assert acks, f"writer never acknowledged a version (exit {proc.poll()})"
        time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        reader.join(10)
        last_acked = max([last_acked, *acks])
        every_acked.update(acks)

        store = LocalStore(root)  # reopening also clears the temp files the kill left behind
        record = store.load(REGISTRY)
        assert record is not None, f"cycle {cycle}: registry lost"
        assert last_acked <= record.version <= last_acked + 1, (cycle, record.version, last_acked)
        assert record.tools == store_tools(record.version)  # whole, and the right version
        assert record.equivalents == [[record.tools[0]["name"]]]
        directory = root / "registries" / REGISTRY
        assert not list(directory.glob(".tmp-*"))
        for path in directory.iterdir():  # every version file left is complete
            data = json.loads(path.read_bytes())
            assert data["tools"] == store_tools(data["version"])
        # The embedding log: every acknowledged append is there and whole (a torn tail is cut).
        vectors = store.get_embeddings("model", [store_hash(v) for v in every_acked])
        assert set(vectors) == {store_hash(v) for v in every_acked}
        for version in every_acked:
            assert np.array_equal(vectors[store_hash(version)], store_vector(version))


# -- the real server under SIGKILL ---------------------------------------------------------------


def server_tool(i: int, marker: str = "") -> dict[str, Any]:
    topic = ("weather", "email", "calendar", "payments", "files", "search", "maps", "music")[i % 8]
    return {
        "name": f"{topic}_tool_{i}",
        "description": f"Work with {topic}: operation number {i}. {marker}".strip(),
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }


class Uploader:
    """Sends writes and remembers, for each version the server would create, its tools."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.sent: dict[int, list[dict[str, Any]]] = {}  # version -> tools exactly as sent
        self.acked = 0  # newest version the server acknowledged
        self.current: list[dict[str, Any]] = []  # tools of the server's current version
        self.version = 0  # the server's current version (acknowledged or found after restart)
        self.counter = 0
        self.writes_acked = 0

    def next_write(self) -> tuple[Callable[[httpx.Client], httpx.Response], list[dict[str, Any]]]:
        """A random write and the tools the registry holds once it is done."""
        self.counter += 1
        marker = f"[write {self.counter}]"
        kind = self.rng.random() if self.current else 0.0
        if kind < 0.6:  # replace: 30-60 tools, one with new text (one embedding to compute)
            chosen = sorted(self.rng.sample(range(60), self.rng.randint(30, 60)))
            fresh = self.rng.choice(chosen)
            tools = [server_tool(i, marker if i == fresh else "") for i in chosen]
            return (lambda c: c.put(f"/registries/{REGISTRY}", json=tools)), tools
        if kind < 0.85 or len(self.current) < 2:  # upsert one tool, new or existing
            tool = server_tool(self.rng.randrange(70), marker)
            merged = {t["name"]: t for t in self.current}
            merged[tool["name"]] = tool  # replaced in place, or appended
            return (lambda c: c.post(f"/registries/{REGISTRY}/tools", json=[tool])), list(
                merged.values()
            )
        victim = self.rng.choice(self.current)["name"]  # delete one tool
        rest = [t for t in self.current if t["name"] != victim]
        return (lambda c: c.delete(f"/registries/{REGISTRY}/tools/{victim}")), rest

    def run(self, client: httpx.Client) -> None:
        """Write until the server dies."""
        while True:
            request, tools = self.next_write()
            expected_version = self.version + 1
            self.sent[expected_version] = tools
            try:
                response = request(client)
            except httpx.TransportError:
                return  # killed mid-request: this write may or may not have landed
            assert response.status_code in (200, 204), response.text
            if response.status_code == 200:
                assert response.json()["version"] == expected_version
            self.acked = self.version = expected_version
            self.current = tools
            self.writes_acked += 1

    def verify(self, client: httpx.Client, cycle: int) -> None:
        """After a restart: the newest acknowledged version (or the one in flight), whole."""
        response = client.get(f"/registries/{REGISTRY}")
        if self.acked == 0 and response.status_code == 404:
            return  # killed before anything was acknowledged
        assert response.status_code == 200, (cycle, response.text)
        body = response.json()
        version = body["version"]
        assert self.acked <= version <= self.acked + 1, (cycle, version, self.acked)
        assert body["tools"] == self.sent[version], (cycle, version)  # never torn, never empty
        self.acked = self.version = version  # what survived a restart is the new baseline
        self.current = body["tools"]


CYCLES = 8


@pytest.mark.e2e
def test_server_keeps_every_acknowledged_write_across_sigkill(
    server_factory: Any, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    uploader = Uploader(rng)
    cycles = 0
    while cycles < CYCLES:  # a count, not a time budget: start-up is slow on a loaded machine
        server = server_factory()
        with httpx.Client(base_url=server.url, timeout=30) as client:
            uploader.verify(client, cycles)
            kill = threading.Timer(rng.uniform(0.05, 0.6), server.proc.kill)
            kill.start()
            uploader.run(client)
            kill.join()
        server.proc.wait(10)
        cycles += 1
    server = server_factory()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        uploader.verify(client, cycles)
        assert uploader.writes_acked > cycles  # writes were acknowledged between the kills
        shortlist = client.post("/shortlist", json={"registry": REGISTRY, "query": "weather"})
        assert shortlist.status_code == 200 and shortlist.json()["k"] >= 1
    assert not list((tmp_path / "data" / "registries" / REGISTRY).glob(".tmp-*"))
