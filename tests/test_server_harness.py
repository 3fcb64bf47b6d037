"""The end-to-end harness (tests/server.py) talks only to the server it started.

Another pytest run on the same machine (CI beside a developer's run) can take a port between
``free_port`` and the child's bind; the stranger's ``/readyz`` then answered 200 while our child
was still loading, and tests went on against a server holding someone else's registries and
learning (rankings that had moved before any feedback was sent)."""

from __future__ import annotations

import http.server
import signal
import threading

import pytest

import tests.server as harness


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_ready_answer_from_another_process_on_our_port_is_refused(tmp_path, monkeypatch):
    stranger = http.server.HTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=stranger.serve_forever, daemon=True).start()
    # the race, made certain: the port handed out is one a stranger listens on
    monkeypatch.setattr(harness, "free_port", lambda: stranger.server_port)
    server = harness.Server(tmp_path / "data", tmp_path / "cache")
    try:
        with pytest.raises(RuntimeError, match="not our server"):
            server.wait_ready(timeout=60)
    finally:
        server.stop(signal.SIGKILL)
        stranger.shutdown()
        stranger.server_close()


def test_two_runs_start_their_port_cycles_apart(monkeypatch):
    """Runs with the same worker name (each ``gw0`` without -n) begin at different ports."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    firsts = set()
    for pid in (4242, 4243, 9001):
        monkeypatch.setattr(harness.os, "getpid", lambda pid=pid: pid)
        firsts.add(next(harness._worker_ports()))
    assert len(firsts) == 3
    assert all(harness.FIRST_PORT <= p < harness.FIRST_PORT + harness.PORTS_PER_WORKER for p in firsts)
