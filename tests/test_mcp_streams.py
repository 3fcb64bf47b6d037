"""Idle ``GET /mcp`` event streams (issue 23, item 5): they time out, and count against their own
bound instead of the connection cap, so they can never starve ``/shortlist`` (before: with
``SHORTLIST_MAX_CONNECTIONS=N``, N idle streams made every request a 503)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.conftest import weather_tools

pytestmark = pytest.mark.e2e

IDLE_SECONDS = 2.0


def open_stream(port: int) -> tuple[socket.socket, bytes]:
    """A raw ``GET /mcp`` asking for an event stream; returns the socket and the response head."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.sendall(
        b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept: text/event-stream\r\n\r\n" % port
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(4096)
        if not chunk:
            break
        head += chunk
    return conn, head


def read_until_closed(conn: socket.socket, timeout: float) -> bytes:
    conn.settimeout(timeout)
    data = b""
    try:
        while chunk := conn.recv(4096):
            data += chunk
            if data.endswith(b"0\r\n\r\n"):  # the chunked body's end: the stream is over
                break
    except TimeoutError:
        pass
    return data


def test_idle_streams_never_starve_requests_and_time_out(server_factory):
    server = server_factory(
        max_connections="4", mcp_max_streams="3", mcp_stream_idle_seconds=str(IDLE_SECONDS)
    )
    put = httpx.put(f"{server.url}/registries/weather", json=weather_tools(), timeout=120)
    assert put.status_code == 200, put.text
    shortlist = {"registry": "weather", "query": "what's the weather in Paris?"}
    streams = [open_stream(server.port) for _ in range(3)]
    opened = time.monotonic()
    try:
        for _, head in streams:
            assert head.startswith(b"HTTP/1.1 200"), head
            assert b"text/event-stream" in head

        # a fourth stream is over the streams' own bound: 503 naming it, with Retry-After
        extra, refused = open_stream(server.port)
        length = int(refused.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(refused.split(b"\r\n\r\n", 1)[1]) < length:
            refused += extra.recv(4096)
        extra.close()
        assert refused.startswith(b"HTTP/1.1 503"), refused
        assert b"too_many_streams" in refused and b"retry-after: 30" in refused.lower()

        # the streams hold no request slot: the whole connection cap is still free for requests
        clients = [httpx.Client(base_url=server.url, timeout=30) for _ in range(4)]
        try:
            for client in clients:
                answer = client.post("/shortlist", json=shortlist)
                assert answer.status_code == 200, answer.text
        finally:
            for client in clients:
                client.close()

        # idle streams are closed after the timeout (the chunked body ends)
        for conn, _ in streams:
            tail = read_until_closed(conn, timeout=IDLE_SECONDS + 10)
            assert tail.endswith(b"0\r\n\r\n"), tail
        assert time.monotonic() - opened >= IDLE_SECONDS - 0.5
    finally:
        for conn, _ in streams:
            conn.close()

    # their slots are free again
    again, head = open_stream(server.port)
    try:
        assert head.startswith(b"HTTP/1.1 200"), head
    finally:
        again.close()
