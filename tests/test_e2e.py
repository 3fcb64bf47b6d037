"""End to end: the real server process, the real MiniLM (ONNX) and the shipped ONNX policy."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

KNOWN = {
    "What's the weather like in Paris right now?": "get_weather",
    "convert 100 dollars to euros": "convert_currency",
    "email the quarterly report to bob@example.com": "send_email",
    "book me a flight from JFK to LAX next friday": "book_flight",
    "read the contents of the file config.yaml": "filesystem/read_file",
    "what is 10 factorial": "math.factorial",
    "open a GitHub issue about the login crash": "github.create_issue",
    "tell the #general Slack channel that the deploy is done": "slack.post_message",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, data_dir: Path, embedder_cache: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(
            os.environ,
            SHORTLIST_PORT=str(self.port),
            SHORTLIST_DATA_DIR=str(data_dir),
            SHORTLIST_EMBEDDER_CACHE_DIR=str(embedder_cache),
            SHORTLIST_DEMO_REGISTRY="",
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--log-level", "warning"],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stdout.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError("server not ready")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)


@pytest.fixture
def server_factory(tmp_path, minilm_cache):
    servers: list[Server] = []

    def start() -> Server:
        server = Server(tmp_path / "data", minilm_cache)
        servers.append(server)
        server.wait_ready()
        return server

    yield start
    for server in servers:
        server.stop(signal.SIGKILL)


def test_real_server_finds_known_tools_and_survives_a_restart(server_factory):
    tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())
    server = server_factory()
    r = httpx.put(f"{server.url}/registries/e2e", json=tools, timeout=60)
    assert r.status_code == 200 and r.json()["tools"] == len(tools["tools"])

    answers = {}
    for query, gold in KNOWN.items():
        body = httpx.post(f"{server.url}/shortlist", json={"registry": "e2e", "query": query}).json()
        names = [t["name"] for t in body["tools"]]
        assert gold in names, (query, names)
        assert body["k"] == len(names) and body["policy"] == "bor"
        answers[query] = names

    metrics = httpx.get(f"{server.url}/metrics").text
    assert f'shortlist_requests_total{{policy="bor",registry="e2e"}} {float(len(KNOWN))}' in metrics

    server.stop(signal.SIGKILL)  # an acknowledged upload must survive a crash
    again = server_factory()
    assert httpx.get(f"{again.url}/registries").json()["registries"] == [
        {"registry": "e2e", "version": 1, "tools": len(tools["tools"])}
    ]
    for query, names in answers.items():
        body = httpx.post(f"{again.url}/shortlist", json={"registry": "e2e", "query": query}).json()
        assert [t["name"] for t in body["tools"]] == names
