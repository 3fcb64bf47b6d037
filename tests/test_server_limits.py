"""Slow and hostile clients against a real `shortlist serve` process (issue 14 item 3): head and
body read timeouts, header size and count limits, a connection cap, and no token in the access
log. Sockets are real and really stall; timeouts are set short (2 s) to keep the tests quick."""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.server import connection_cap, raise_fd_limit, redact_query
from service.settings import ServiceSettings
from tests.server import Server, Servers

TIMEOUT = 2.0  # header_timeout_seconds and body_timeout_seconds of the test server
SLACK = 1.5  # scheduling delay allowed on a loaded machine (2 shared cores)
PARTIAL_HEAD = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"  # no blank line: the head never ends


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path) -> Iterator[Servers]:
    started = Servers(tmp_path_factory.mktemp("limits"), minilm_cache)
    yield started
    started.close()


@pytest.fixture(scope="module")
def server(servers: Servers) -> Server:
    return servers.start(
        log_level="info",
        header_timeout_seconds=str(TIMEOUT),
        body_timeout_seconds=str(TIMEOUT),
    )


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def read_all(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (or ``timeout`` passes)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def status_of(response: bytes) -> int | None:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else None


def ensure_fd_room(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, needed), hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= needed, "the test needs more descriptors"


def test_half_open_requests_neither_delay_a_fresh_client_nor_outlive_the_timeout(server):
    ensure_fd_room(1200)
    opened: dict[socket.socket, float] = {}
    for _ in range(1000):
        sock = connect(server)
        sock.sendall(PARTIAL_HEAD)
        opened[sock] = time.monotonic()
    silent = {connect(server): time.monotonic() for _ in range(20)}  # connect, send nothing
    opened.update(silent)

    start = time.monotonic()
    fresh = httpx.get(f"{server.url}/healthz", timeout=10)
    fresh_seconds = time.monotonic() - start
    assert fresh.status_code == 200
    assert fresh_seconds < 1.0, f"a fresh client waited {fresh_seconds:.2f} s behind 1,020 stalled ones"

    # The server answers every stalled head with 408 and closes it, silent ones it just closes.
    closed_after: dict[socket.socket, float] = {}
    received: dict[socket.socket, bytes] = dict.fromkeys(opened, b"")
    with selectors.DefaultSelector() as selector:
        for sock in opened:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + TIMEOUT + 10
        while len(closed_after) < len(opened) and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.5):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                received[sock] += chunk
                if not chunk:
                    closed_after[sock] = time.monotonic() - opened[sock]
                    selector.unregister(sock)
    for sock in opened:
        sock.close()
    assert len(closed_after) == len(opened), f"{len(opened) - len(closed_after)} still open"
    latest = max(closed_after.values())
    earliest = min(closed_after.values())
    assert earliest >= TIMEOUT - 0.1, f"closed after {earliest:.2f} s, before the timeout"
    assert latest <= TIMEOUT + SLACK, f"one stayed open {latest:.2f} s (timeout {TIMEOUT} s)"
    statuses = {status_of(received[sock]) for sock in opened if sock not in silent}
    assert statuses == {408}
    assert b"SHORTLIST_HEADER_TIMEOUT_SECONDS" in next(iter(received.values()))
    assert {received[sock] for sock in silent} == {b""}
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200


def test_a_head_dripped_byte_by_byte_still_times_out(server):
    sock = connect(server)
    start = time.monotonic()
    sock.sendall(b"GET /healthz HTTP/1.1\r\n")
    for i in range(int(TIMEOUT / 0.25) + 8):  # progress every 0.25 s, never the blank line
        try:
            sock.sendall(b"X-Drip-%d: y\r\n" % i)
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(0.25)
    response = read_all(sock, 5)
    sock.close()
    assert status_of(response) == 408
    assert time.monotonic() - start < TIMEOUT + 2 + SLACK  # drip (<= ~2.5 s past it) included


def test_a_stalled_body_is_408_and_writes_nothing(server):
    sock = connect(server)
    start = time.monotonic()
    sock.sendall(
        b"PUT /registries/stalled HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\n\r\n[{"
    )
    response = read_all(sock, TIMEOUT + 5)
    took = time.monotonic() - start
    sock.close()
    assert status_of(response) == 408, response
    assert b"SHORTLIST_BODY_TIMEOUT_SECONDS" in response
    assert TIMEOUT - 0.1 <= took <= TIMEOUT + SLACK
    assert httpx.get(f"{server.url}/registries/stalled", timeout=10).status_code == 404


def test_a_slow_body_that_keeps_coming_is_not_cut(server):
    # 6,000 bytes over 3 s: longer than the timeout, never a 2 s pause, and above the default
    # minimum rate (1,024 B/s) on average (tests/test_slow_bodies.py: a body below it is cut)
    body = b"[" + b" " * 5998 + b"]"
    sock = connect(server)
    sock.sendall(
        b"PUT /registries/slow HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    for start in range(0, len(body), 500):
        sock.sendall(body[start : start + 500])
        time.sleep(0.25)
    response = read_all(sock, 10)  # keep-alive: the server closes it at the next head's timeout
    sock.close()
    assert status_of(response) == 200, response


@pytest.mark.parametrize(
    ("name", "head"),
    [
        ("one 100 KB header, in one read", b"X-Big: " + b"a" * 100_000 + b"\r\n"),
        ("a 20 MB header", b"X-Big: " + b"a" * 20_000_000 + b"\r\n"),
        ("150 header fields", b"".join(b"X-%d: a\r\n" % i for i in range(150))),
        ("200,000 header fields", b"X: a\r\n" * 200_000),
    ],
)
def test_oversized_or_too_many_headers_are_431(server, name, head):
    sock = connect(server)
    request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + head + b"\r\n"
    # The server answers and closes before a large head is all sent: send from a thread.
    sender = threading.Thread(target=_send_quietly, args=(sock, request), daemon=True)
    sender.start()
    response = read_all(sock, 10)
    sender.join(10)
    sock.close()
    assert status_of(response) == 431, (name, response[:200])
    assert b"headers_too_large" in response


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # closed by the server mid-send: expected for large heads
        sock.sendall(data)


def test_a_large_head_within_the_limits_is_served(server):
    head = b"".join(b"X-%d: %s\r\n" % (i, b"a" * 1000) for i in range(50))  # ~51 KB, 51 fields
    sock = connect(server)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + head + b"\r\n")
    response = read_all(sock, 10)
    sock.close()
    assert status_of(response) == 200


def test_a_token_in_the_query_string_is_not_logged(server):
    secret = "s3cret-in-the-url"
    bare = "bare-s3cret-token"  # ?<token>, no name= (issue 23: this one was logged)
    assert httpx.get(f"{server.url}/healthz?token={secret}&x=1", timeout=10).status_code == 200
    assert httpx.get(f"{server.url}/readyz?{bare}", timeout=10).status_code == 200
    deadline = time.monotonic() + 5
    log = ""
    while "GET /readyz?" not in log and time.monotonic() < deadline:
        time.sleep(0.1)
        log = server.log_path.read_text(errors="replace")
    assert "/healthz?*** " in log and "/readyz?*** " in log
    assert secret not in log and bare not in log and "token=" not in log


def test_a_connection_beyond_the_cap_is_503_at_once(servers):
    # no connections kept past the cap for probes (tests/test_slow_bodies.py covers those)
    capped = servers.start(max_connections="20", header_timeout_seconds="30", probe_connections="0")
    held = [connect(capped) for _ in range(20)]
    for sock in held:
        sock.sendall(PARTIAL_HEAD)
    time.sleep(0.5)  # let the server accept them all
    extra = connect(capped)
    start = time.monotonic()
    response = read_all(extra, 5)
    extra.close()
    assert status_of(response) == 503, response
    assert b"too_many_connections" in response and b"SHORTLIST_MAX_CONNECTIONS" in response
    assert time.monotonic() - start < 1.0
    for sock in held:
        sock.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the server notices the closes
        if httpx.get(f"{capped.url}/healthz", timeout=5).status_code == 200:
            break
        time.sleep(0.1)
    assert httpx.get(f"{capped.url}/healthz", timeout=5).status_code == 200


def test_the_connection_cap_fits_the_descriptor_limit():
    settings = ServiceSettings(max_connections=2048)
    assert connection_cap(settings, 100_000) == 2048
    assert connection_cap(settings, 1024) == 1024 - 128 - settings.mcp_max_streams  # streams kept free
    soft = raise_fd_limit()
    assert soft == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert hard == resource.RLIM_INFINITY or soft == hard


def test_server_limits_are_documented_settings():
    for name in (
        "max_header_bytes",
        "max_header_count",
        "header_timeout_seconds",
        "body_timeout_seconds",
        "keep_alive_seconds",
        "max_connections",
    ):
        assert ServiceSettings.model_fields[name].description, name
    defaults = ServiceSettings()
    assert defaults.max_header_bytes == 64 * 1024 and defaults.max_header_count == 100
    assert defaults.header_timeout_seconds == 30 and defaults.body_timeout_seconds == 30


@pytest.mark.parametrize(
    ("target", "logged"),
    [
        ("/healthz", "/healthz"),
        ("/healthz?", "/healthz?"),
        ("/p?token=abc", "/p?***"),
        ("/p?token=abc&x=&y", "/p?***"),
        ("/p?s3cret-token", "/p?***"),
        ("/p?s3cret-token=1", "/p?***"),
    ],
)
def test_query_values_are_redacted(target, logged):
    assert redact_query(target) == logged
