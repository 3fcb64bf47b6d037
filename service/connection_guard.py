"""The connection-level limits uvicorn lacks: one h11 protocol class that enforces them.

uvicorn bounds neither how long a client may take to send a request head nor how many headers
it may send, and accepts connections until the process runs out of file descriptors. The
protocol here is uvicorn's h11 protocol (chosen explicitly: ``auto`` would pick httptools,
whose parser has no head-size limit) with:

- a head-size limit (h11's incomplete-event limit) and a header-count limit: 431;
- a head timeout: a request head not complete within ``header_timeout_seconds`` of the
  connection opening (or of the previous response) gets 408 and is closed (an idle connection
  that sent nothing is just closed);
- a body timeout: a request body that stalls for ``body_timeout_seconds``, or arrives slower
  on average than ``body_min_bytes_per_second`` (it must be complete within
  ``body_timeout_seconds`` + bytes received / that rate of its head), gets 408 (when no
  response has started) and is closed: a body trickled in a byte at a time cannot hold a
  connection for long;
- a connection cap: a connection beyond ``max_connections`` gets 503 and is closed at once,
  so descriptors stay bounded (uvicorn's ``limit_concurrency`` also answers 503 to requests
  made while the process is at the cap). A connection holding an open ``GET /mcp`` event
  stream is not counted: streams have their own bound (``mcp_max_streams``, enforced and
  timed out by :mod:`service.mcp`), so idle streams can never starve requests;
- probes outside the cap: past the cap, ``probe_connections`` more connections are taken for
  ``GET /healthz`` and ``/readyz`` only (anything else on them gets the 503, and they close
  after one response), so a liveness probe never fails because slow clients hold every slot.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.errors import error_body
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

HTTP_IMPL = "h11"
"""The HTTP/1.1 parser: h11, whose protocol class :class:`GuardedH11Protocol` extends."""


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-connection limits of :class:`GuardedH11Protocol`, read from :class:`ServiceSettings`
    (:meth:`of`), whose fields declare the defaults."""

    max_header_bytes: int
    max_header_count: int
    header_timeout: float
    body_timeout: float
    body_min_rate: int
    max_connections: int
    probe_connections: int
    max_streams: int
    stream_path: str = "/mcp"

    @classmethod
    def of(cls, settings: ServiceSettings) -> ConnectionLimits:
        return cls(
            max_header_bytes=settings.max_header_bytes,
            max_header_count=settings.max_header_count,
            header_timeout=settings.header_timeout_seconds,
            body_timeout=settings.body_timeout_seconds,
            body_min_rate=settings.body_min_bytes_per_second,
            max_connections=settings.max_connections,
            probe_connections=settings.probe_connections,
            max_streams=settings.mcp_max_streams,
        )


def raw_error(status: int, reason: str, error_type: str, message: str, details: Any = None) -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 error response in the API's JSON error shape."""
    body = json.dumps(error_body(error_type, message, details), separators=(",", ":"), allow_nan=False).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


TOO_MANY_HEADERS = "too many header fields"


def head_bytes(request: h11.Request) -> int:
    """Size of a parsed request head: request line and fields, as sent (bar optional spaces)."""
    line = len(request.method) + len(request.target) + len(b"  HTTP/1.1\r\n")
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers)


class _LimitedConnection(h11.Connection):
    """An h11 server connection that refuses too large a head or too many header fields (431).

    h11's own limit catches a head still incomplete past ``max_header_bytes``; one that arrived
    whole in a single read is measured once parsed.
    """

    def __init__(self, max_header_bytes: int, max_header_count: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self.max_header_bytes = max_header_bytes
        self.max_header_count = max_header_count
        self.error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            event = super().next_event()
            if isinstance(event, h11.Request):
                if len(event.headers) > self.max_header_count:
                    raise h11.RemoteProtocolError(TOO_MANY_HEADERS, error_status_hint=431)
                if head_bytes(event) > self.max_header_bytes:
                    raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
        except h11.RemoteProtocolError as exc:
            self.error = exc
            raise
        return event


class StreamCount:
    """Connections of one server not counted against its cap: serving an event stream
    (``GET /mcp``) right now (``open``), or kept past the cap for health probes (``probes``)."""

    def __init__(self) -> None:
        self.open = 0
        self.probes = 0


PROBE_PATHS = (b"/healthz", b"/readyz")
PROBE_LINE_BYTES = 8192  # a probe's request line is short; a longer one is not a probe


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with head/body read timeouts, header limits and a connection cap.

    Subclassed per server by :func:`protocol_class`, which sets :attr:`limits`.
    """

    # the settings' defaults (model_construct reads no environment); protocol_class sets a server's
    limits: ClassVar[ConnectionLimits] = ConnectionLimits.of(ServiceSettings.model_construct())
    streams: ClassVar[StreamCount] = StreamCount()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limited = _LimitedConnection(self.limits.max_header_bytes, self.limits.max_header_count)
        self.conn = self.limited
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._head_started = False  # bytes of the current request head have arrived
        self._refused = False
        self._stream_counted = False
        self._probe_only = False  # taken past the cap: health probes only
        self._probe_head: bytes | None = b""  # a probe-only connection's bytes until its request line is whole
        self._body_started: float | None = None  # when the current body began arriving
        self._body_received = 0

    # -- connection ----------------------------------------------------------------------------

    @property
    def streaming(self) -> bool:
        """This connection is serving an event stream (``GET /mcp``) that has not ended."""
        cycle = self.cycle
        return (
            cycle is not None
            and not cycle.response_complete
            and cycle.scope.get("method") == "GET"
            and cycle.scope.get("path") == self.limits.stream_path
        )

    def _count_stream(self, streaming: bool) -> None:
        """Keep :attr:`streams` (this server's open streams) in step with this connection."""
        if streaming != self._stream_counted:
            self._stream_counted = streaming
            self.streams.open += 1 if streaming else -1

    def _busy(self) -> int:
        return len(self.connections) - self.streams.open - self.streams.probes

    def _too_many(self, busy: int) -> bytes:
        return raw_error(
            503, "Service Unavailable", "too_many_connections",
            f"the server has {busy} open connections, its limit "
            "(SHORTLIST_MAX_CONNECTIONS); retry later",
            {"limit": self.limits.max_connections},
        )

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        busy = self._busy()
        if busy >= self.limits.max_connections:
            if self.streams.probes < self.limits.probe_connections:
                self._probe_only = True  # decided by its request line (data_received)
                self.streams.probes += 1
            else:
                self._refused = True
                self.transport = transport
                log.warning("connection refused: %d open (SHORTLIST_MAX_CONNECTIONS)", busy)
                transport.write(self._too_many(busy))
                transport.close()
                return
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self._count_stream(False)
        if self._probe_only:
            self._probe_only = False
            self.streams.probes -= 1
        if self._refused:
            return  # refused at connect: uvicorn never saw this connection
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused or self.transport.is_closing():
            return
        if self._probe_only and self._probe_head is not None:
            data = self._probe_request(data)
            if not data:
                return
        if self.conn.their_state is h11.IDLE:
            self._head_started = True
        if self.conn.their_state is h11.SEND_BODY:
            self._body_received += len(data)
        super().data_received(data)
        if self.conn.their_state is h11.SEND_BODY:
            if self._body_started is None:  # the head just completed
                self._body_started, self._body_received = self.loop.time(), 0
            self._arm_body_timer()  # progress: the stall clock restarts, the total one does not

    def _probe_request(self, data: bytes) -> bytes:
        """On a connection taken past the cap: hold bytes until the request line is whole,
        then let a health probe through (returns the bytes held) or answer 503 (returns b"")."""
        assert self._probe_head is not None
        head = self._probe_head + data
        line, found, _ = head.partition(b"\r\n")
        if not found and len(head) < PROBE_LINE_BYTES:
            self._probe_head = head
            self._head_started = True
            return b""
        parts = line.split(b" ")
        path = parts[1].partition(b"?")[0] if len(parts) == 3 else b""
        if parts[0] in (b"GET", b"HEAD") and path in PROBE_PATHS:
            self._probe_head = None
            return head
        self._probe_head = None  # closing: data_received ignores the rest
        self._cancel_timers()
        log.warning("request refused: %d open connections (SHORTLIST_MAX_CONNECTIONS)", self._busy())
        self.transport.write(self._too_many(self._busy()))
        self.transport.close()
        return b""

    def handle_events(self) -> None:
        super().handle_events()
        self._count_stream(self.streaming)
        state = self.conn.their_state
        if state is not h11.IDLE:
            self._cancel(self._head_timer)
            self._head_timer = None
            self._head_started = False
        if state is not h11.SEND_BODY:
            self._cancel(self._body_timer)
            self._body_timer = None
            self._body_started = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._count_stream(False)
        if self._probe_only and not self.transport.is_closing():
            self.transport.close()  # one probe per connection taken past the cap
            return
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_head_timer()  # the next request's head has its own deadline

    def send_400_response(self, msg: str) -> None:
        error = self.limited.error
        if error is None or error.error_status_hint != 431:
            super().send_400_response(msg)
            return
        too_many = str(error) == TOO_MANY_HEADERS
        limit = self.limits.max_header_count if too_many else self.limits.max_header_bytes
        message = (
            f"request has more than {limit} header fields (SHORTLIST_MAX_HEADER_COUNT)"
            if too_many
            else f"request head is larger than {limit} bytes (SHORTLIST_MAX_HEADER_BYTES)"
        )
        self.logger.warning("431: %s", message)
        self._reply_and_close(
            raw_error(431, "Request Header Fields Too Large", "headers_too_large", message, {"limit": limit})
        )

    # -- timers --------------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._cancel(self._head_timer)
        self._head_started = bool(self.conn.trailing_data[0])  # a pipelined head has begun
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timed_out)

    def _arm_body_timer(self) -> None:
        """Due at the next stall deadline or the body's total deadline, whichever is first."""
        self._cancel(self._body_timer)
        now = self.loop.time()
        due = now + self.limits.body_timeout
        if self._body_started is not None:
            total = self._body_started + self.limits.body_timeout
            due = min(due, total + self._body_received / self.limits.body_min_rate)
        self._body_timer = self.loop.call_at(max(due, now), self._body_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if not self._head_started:  # an idle connection: nothing to answer
            self.transport.close()
            return
        self._reply_and_close(
            raw_error(
                408, "Request Timeout", "request_timeout",
                f"request head not received within {self.limits.header_timeout:g} s "
                "(SHORTLIST_HEADER_TIMEOUT_SECONDS)",
            )
        )

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        waiting = self.cycle is not None and self.cycle.waiting_for_100_continue
        if self.flow.read_paused or waiting:  # the app is not reading yet: not the client's stall
            self._body_started, self._body_received = self.loop.time(), 0  # a fresh allowance
            self._arm_body_timer()
            return
        response = b""
        if self.cycle is not None and not self.cycle.response_started:
            response = raw_error(
                408, "Request Timeout", "request_timeout",
                f"request body stalled for {self.limits.body_timeout:g} s "
                "(SHORTLIST_BODY_TIMEOUT_SECONDS) or arrived slower than "
                f"{self.limits.body_min_rate} bytes/s on average after that allowance "
                "(SHORTLIST_BODY_MIN_BYTES_PER_SECOND)",
                {"received_bytes": self._body_received},
            )
        self._reply_and_close(response)

    def _reply_and_close(self, response: bytes) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            # The app sees a disconnect and anything it sends is dropped.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if response:
            self.transport.write(response)
        self.transport.close()

    def _cancel_timers(self) -> None:
        self._cancel(self._head_timer)
        self._cancel(self._body_timer)
        self._head_timer = self._body_timer = None

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()


def protocol_class(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` subclass bound to ``limits`` (uvicorn builds one per connection)."""
    return type(
        "GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "streams": StreamCount()}
    )
