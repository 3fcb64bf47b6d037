"""A real `redis-server` on a free loopback port, started by the tests themselves.

Never a system service: each instance has its own port and directory, and can be stopped and
started again (same port, same directory) to simulate an outage.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis

from tests.server import free_port

REDIS_SERVER = shutil.which("redis-server")
INSTALL_HINT = "redis-server is not installed: apt-get install redis-server (make test does this as root)"


class RedisServer:
    """One ``redis-server`` process.

    Args:
        directory: working directory (append-only file, log).
        appendonly: persist every write (``appendfsync always``) so data survives a restart;
            otherwise nothing is ever written to disk.
    """

    def __init__(self, directory: Path, *, appendonly: bool = False) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError(INSTALL_HINT)
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.appendonly = appendonly
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10) -> RedisServer:
        assert REDIS_SERVER is not None
        args = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--logfile", "redis.log",
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                if self.proc.poll() is not None:
                    log = self.dir / "redis.log"
                    tail = log.read_text()[-2000:] if log.exists() else ""
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {tail}")
                try:
                    if client.ping():
                        # Our own process, not another test's server on a reused port.
                        pid = client.info("server")["process_id"]
                        if pid != self.proc.pid:
                            raise RuntimeError(f"port {self.port} answers for redis pid {pid}, not ours")
                        return self
                except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"redis-server on port {self.port} did not answer")
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """Stop the server (SIGKILL by default: an outage, not a goodbye)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)
