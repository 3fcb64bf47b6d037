"""Slow request bodies against a real `shortlist serve` process and raw sockets: a body that
trickles in (a byte now and then, never a long pause) still gets 408 once it falls below the
minimum rate; a body without a token gets 401 before it is read; health probes answer while
slow clients hold every connection slot. Bounds are set short by environment."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server import Server, Servers
from tests.test_server_limits import read_all, status_of

TOKEN = "slow-bodies-test-token-0123456789"
HEAD = (
    "POST /shortlist HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    "content-length: 100000\r\n{auth}\r\n"
)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path) -> Iterator[Servers]:
    started = Servers(tmp_path_factory.mktemp("slow"), minilm_cache)
    yield started
    started.close()


def drip(sock: socket.socket, stop: threading.Event, every: float) -> None:
    """One body byte every ``every`` seconds until the server closes or ``stop`` is set."""
    while not stop.wait(every):
        try:
            sock.sendall(b" ")
        except OSError:
            return


def test_a_trickled_body_gets_408_though_it_never_pauses_long(servers: Servers):
    server = servers.start(
        data_dir=servers.base / "trickle", body_timeout_seconds="1", body_min_bytes_per_second="100"
    )
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(HEAD.format(auth="").encode())
    stop = threading.Event()
    dripper = threading.Thread(target=drip, args=(sock, stop, 0.3), daemon=True)
    dripper.start()  # a byte every 0.3 s: the 1 s stall timeout alone never fires
    response = read_all(sock, 15)
    stop.set()
    sock.close()
    assert status_of(response) == 408, response[:300]
    assert b"SHORTLIST_BODY_MIN_BYTES_PER_SECOND" in response

    # a body sent at a decent rate may take longer than body_timeout_seconds in all
    body = json.dumps({"registry": "none", "query": "x" * 1500}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(
        b"POST /shortlist HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    )
    for start in range(0, len(body), 300):  # ~300 bytes every 0.3 s: 1.5 s in all
        sock.sendall(body[start : start + 300])
        time.sleep(0.3)
    response = read_all(sock, 15)
    sock.close()
    assert status_of(response) == 404, response[:300]  # answered: the registry is unknown


@pytest.fixture(scope="module")
def guarded(servers: Servers) -> Server:
    return servers.start(
        data_dir=servers.base / "guarded",
        query_token=TOKEN,
        max_connections="20",
        body_timeout_seconds="20",
    )


def test_a_body_without_a_token_is_refused_before_it_is_read(guarded: Server):
    sock = socket.create_connection(("127.0.0.1", guarded.port), timeout=10)
    sock.sendall(HEAD.format(auth="").encode())  # the head only: the body never comes
    response = read_all(sock, 10)
    sock.close()
    assert status_of(response) == 401, response[:300]
    assert b"missing_token" in response


def test_health_probes_answer_while_slow_bodies_hold_every_slot(guarded: Server):
    held = []
    for _ in range(20):  # the cap: each sends its token, a head and one body byte
        sock = socket.create_connection(("127.0.0.1", guarded.port), timeout=10)
        sock.sendall(HEAD.format(auth=f"authorization: Bearer {TOKEN}\r\n").encode() + b"{")
        held.append(sock)
    time.sleep(0.5)  # let the server take all of them
    auth = {"authorization": f"Bearer {TOKEN}"}
    query = {"registry": "x", "query": "y"}
    try:
        for path in ("/healthz", "/readyz", "/healthz"):
            r = httpx.get(f"{guarded.url}{path}", timeout=10)
            assert r.status_code == 200, (path, r.status_code, r.text)
        for _ in range(20):  # more than the probe connections: each refusal frees its own
            refused = httpx.post(f"{guarded.url}/shortlist", json=query, headers=auth, timeout=10)
            assert refused.status_code == 503 and refused.json()["error"]["type"] == "too_many_connections"
        assert httpx.get(f"{guarded.url}/healthz", timeout=10).status_code == 200
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the server notices the closes: requests get slots again
        answered = httpx.post(f"{guarded.url}/shortlist", json=query, headers=auth, timeout=10)
        if answered.status_code != 503:
            break
        time.sleep(0.2)
    assert answered.status_code == 404, answered.text  # served: the registry is unknown
