"""What every benchmark script needs: a real `shortlist serve` on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_EMBEDDER_CACHE = ROOT / "data" / "cache" / "embedder"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class RunningServer:
    url: str
    pid: int


@contextlib.contextmanager
def serve(
    embedder_cache: Path = DEFAULT_EMBEDDER_CACHE, *, data_dir: Path | None = None, **settings: str
) -> Iterator[RunningServer]:
    """Start the server with a fresh data directory (unless given), wait until ready, stop it after.

    Keyword arguments become ``SHORTLIST_<NAME>`` settings.
    """
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        env = dict(
            os.environ,
            SHORTLIST_PORT=str(port),
            SHORTLIST_DATA_DIR=str(data_dir or tmp),
            SHORTLIST_EMBEDDER_CACHE_DIR=str(embedder_cache),
            SHORTLIST_DEMO_REGISTRY="",
            HF_HUB_OFFLINE="1",
            **{f"SHORTLIST_{key.upper()}": value for key, value in settings.items()},
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--log-level", "warning"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}")
                try:
                    if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("server not ready after 300 s")
                time.sleep(0.2)
            yield RunningServer(url=url, pid=proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
