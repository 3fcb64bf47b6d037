"""A real `shortlist serve` process on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import fcntl
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


PORTS_PER_WORKER = 1000
FIRST_PORT = 20000  # below Linux's ephemeral range (32768+), so no outgoing connection holds one


def _worker_ports() -> Iterator[int]:
    """This pytest worker's own block of ports, each handed out at most once per cycle.

    The cycle starts at an offset taken from the process id: two pytest runs on one machine (a CI
    run beside a developer's) have the same worker names, and starting both at the block's first
    port made them race for the same ports, test for test.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    start = FIRST_PORT + (int(worker) if worker.isdigit() else 0) * PORTS_PER_WORKER
    block = range(start, start + PORTS_PER_WORKER)
    offset = os.getpid() % PORTS_PER_WORKER
    return itertools.cycle([*block[offset:], *block[:offset]])


_PORTS = _worker_ports()
_LOCKS = Path(os.environ.get("TMPDIR", "/tmp")) / "tool-shortlist-test-ports"
_HELD: dict[int, int] = {}  # port -> the open lock file that reserves it for this process


def _reserve(port: int) -> bool:
    """Hold ``port``'s lock file for the rest of this process (True), unless another pytest
    session on this machine holds it. Sessions share a block (a single ``pytest`` is worker
    gw0); the pid offset only spreads their starts, so their cycles still meet, and then one
    server fails to bind while the other session's answers its readiness poll (an acknowledged
    job "disappears" with a 404; :meth:`Server._check_ours` turns that into an error, this
    prevents it). The kernel drops the lock when the process dies, however it dies."""
    if port in _HELD:
        return True
    _LOCKS.mkdir(exist_ok=True)
    fd = os.open(_LOCKS / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _HELD[port] = fd
    return True


def free_port() -> int:
    """A free loopback port from this worker's block, reserved against other test sessions.

    Not ``bind(0)``: under ``pytest -n`` a port one worker's test has just freed (a Redis stopped
    to simulate an outage, to be restarted on the same port) could be handed to the other
    worker's next server, and the two tests would then share one Redis.
    """
    for _ in range(PORTS_PER_WORKER):
        port = next(_PORTS)
        if not _reserve(port):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in this worker's block of {PORTS_PER_WORKER}")


def _listener_pids(port: int) -> set[int]:
    """The pids holding a socket listening on ``port`` on any IPv4 address (Linux ``/proc``;
    empty where it cannot be told). A set: a forked child may hold its parent's socket too."""
    try:
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return set()
    suffix = f":{port:04X}"
    inodes = {f"socket:[{cols[9]}]" for cols in (row.split() for row in rows)
              if cols[1].endswith(suffix) and cols[3] == "0A"}  # 0A: LISTEN
    pids = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd") if inodes else ():
        try:
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                pids.add(int(fd_dir.parent.name))
        except OSError:  # a process that ended, or one we may not look into
            continue
    return pids


class Server:
    """Starts `python -m service.cli serve` (the very code path of `shortlist serve`, through
    service.server.serve); extra keyword arguments become SHORTLIST_* settings."""

    def __init__(
        self, data_dir: Path, embedder_cache: Path, log_level: str = "warning", **settings: str
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = Path(data_dir)
        env = dict(
            os.environ,
            SHORTLIST_PORT=str(self.port),
            SHORTLIST_DATA_DIR=str(data_dir),
            SHORTLIST_EMBEDDER_CACHE_DIR=str(embedder_cache),
            SHORTLIST_DEMO_REGISTRY="",  # no demo registry unless demo_registry= is given
        )
        env.update({f"SHORTLIST_{key.upper()}": value for key, value in settings.items()})
        self.log_path = Path(data_dir).parent / f"server-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:  # a file, not a pipe: a full pipe would block the server
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve", "--log-level", log_level],
                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    self._check_ours()
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError("server not ready")

    def _check_ours(self) -> None:
        """Refuse a ready answer from a server that is not this process.

        Between :func:`free_port` and the child's bind, another pytest run on the machine can take
        the port; our child then fails to bind only after loading its model, and meanwhile the other
        run's server answers ``/readyz``: the test would go on against a stranger holding its own
        registries and learning (seen as rankings that moved before any feedback was sent).
        """
        holders = _listener_pids(self.port)
        if holders and self.proc.pid not in holders:
            self.proc.kill()
            raise RuntimeError(f"port {self.port} answers for pids {sorted(holders)}, not our server {self.proc.pid}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)


class Servers:
    """Starts servers sharing one base directory and kills every one of them at :meth:`close`."""

    def __init__(self, base: Path, embedder_cache: Path) -> None:
        self.base = Path(base)
        self.embedder_cache = embedder_cache
        self.started: list[Server] = []

    def start(
        self,
        *,
        data_dir: Path | None = None,
        wait: bool = True,
        log_level: str = "warning",
        **settings: str,
    ) -> Server:
        """A new server; ``data_dir`` defaults to ``<base>/data`` (shared by all)."""
        server = Server(data_dir or self.base / "data", self.embedder_cache, log_level, **settings)
        self.started.append(server)
        if wait:
            server.wait_ready()
        return server

    def close(self) -> None:
        for server in self.started:
            server.stop(signal.SIGKILL)
