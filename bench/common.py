"""What every benchmark script needs: a real `shortlist serve` on a free loopback port, the dev
sets as raw JSON, and the agent model the learning benchmarks replay."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_EMBEDDER_CACHE = ROOT / "data" / "cache" / "embedder"
#: the dev sets (read-only); SHORTLIST_SHARED_DATA points elsewhere (a worktree's checkout)
SHARED_DATA = Path(os.environ.get("SHORTLIST_SHARED_DATA", ROOT.parent / "shared" / "data"))
NOISE_SHARE = 0.1  # the learning benchmarks' agent reports a random shown tool this often
FOUND_ELSEWHERE = 0.5  # ... and, when the gold tool was not shown, finds it elsewhere this often


def raw_dataset(name: str, root: Path = SHARED_DATA) -> tuple[Any, list[dict[str, Any]]]:
    """A dev set as its files hold it: the tools payload (uploadable as is) and the queries."""
    tools = json.loads((root / name / "tools.json").read_text())
    lines = (root / name / "queries.jsonl").read_text().splitlines()
    return tools, [json.loads(line) for line in lines if line]


def poisoned_uses(
    rng: random.Random, gold: Sequence[str], shown: Sequence[str], tools: Sequence[str]
) -> list[str]:
    """What the poisoning caller reports: the best-ranked shown tool that is not gold, else a
    random tool of the registry (``tools``)."""
    wrong = [n for n in shown if n not in gold]
    return wrong[:1] or [rng.choice(tools)]


def agent_uses(rng: random.Random, gold: Sequence[str], shown: Sequence[str]) -> list[str] | None:
    """What the issue's simulated agent reports for a shortlist: a random shown tool
    (``NOISE_SHARE`` of events), else the gold tools shown, else with ``FOUND_ELSEWHERE`` the gold
    tools found elsewhere (reported on the shortlist that missed them), else nothing (None)."""
    if rng.random() < NOISE_SHARE and shown:
        return [rng.choice(shown)]
    if set(gold) & set(shown):
        return [g for g in gold if g in shown]
    if rng.random() < FOUND_ELSEWHERE:
        return list(gold)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_server(directory: Path | None = None) -> Iterator[str]:
    """A fresh ``redis-server`` without persistence on a free loopback port (its files in
    ``directory``, default a temporary one); yields its URL and stops it on exit."""
    import shutil

    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed: apt-get install redis-server")
    port = free_port()
    with contextlib.ExitStack() as stack:
        where = directory if directory is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(where)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        try:
            client = redis.Redis(port=port)
            for _ in range(200):
                try:
                    client.ping()
                    break
                except redis.exceptions.ConnectionError:
                    time.sleep(0.05)
            else:
                raise RuntimeError("redis-server did not start")
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(10)


def rss_mib(pid: int) -> float:
    """Resident memory of a process in MiB (``nan`` if /proc does not say)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass(frozen=True)
class RunningServer:
    url: str
    pid: int


class Server:
    """One `shortlist serve` process on a free loopback port; call :meth:`wait_ready` next.

    Keyword arguments become ``SHORTLIST_<NAME>`` settings; output goes to ``log_path`` (or is
    discarded).
    """

    def __init__(
        self,
        embedder_cache: Path,
        data_dir: Path,
        *,
        log_path: Path | None = None,
        root: Path = ROOT,
        **settings: str,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(
            os.environ,
            SHORTLIST_PORT=str(self.port),
            SHORTLIST_DATA_DIR=str(data_dir),
            SHORTLIST_EMBEDDER_CACHE_DIR=str(embedder_cache),
            SHORTLIST_DEMO_REGISTRY="",
            # benchmarks cycle over a few queries: measure the model, not the query cache,
            # unless a bench asks for it (query_cache_size=...)
            SHORTLIST_QUERY_CACHE_SIZE="0",
            HF_HUB_OFFLINE="1",
        )
        env.update({f"SHORTLIST_{key.upper()}": value for key, value in settings.items()})
        if root != ROOT and os.environ.get("BENCH_BASELINE_PYTHONPATH"):
            # a baseline revision may need other versions of a dependency than this venv holds
            # (e.g. mcp 1.x before the 2.x face): they are put first for its server only
            env["PYTHONPATH"] = os.pathsep.join(
                [os.environ["BENCH_BASELINE_PYTHONPATH"], env.get("PYTHONPATH", "")]
            )
        self._log = open(log_path, "wb") if log_path else None  # noqa: SIM115  # a file (a full pipe would block), closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--log-level", "warning"],
            env=env, cwd=root, stdout=self._log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready after {timeout:.0f} s")
            time.sleep(0.1)

    def stop(self, *, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(30)
        if self._log is not None:
            self._log.close()


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """A temporary git worktree of ``revision`` (e.g. the baseline of a before/after run)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", str(path), revision], cwd=ROOT, check=True
        )
        try:
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


@contextlib.contextmanager
def serve(
    embedder_cache: Path = DEFAULT_EMBEDDER_CACHE,
    *,
    data_dir: Path | None = None,
    root: Path = ROOT,
    **settings: str,
) -> Iterator[RunningServer]:
    """Start the server with a fresh data directory (unless given), wait until ready, stop it after.

    ``root`` is the checkout to serve (another revision's worktree, for before/after runs);
    keyword arguments become ``SHORTLIST_<NAME>`` settings.
    """
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(embedder_cache, data_dir or Path(tmp), root=root, **settings)
        try:
            server.wait_ready()
            yield RunningServer(url=server.url, pid=server.pid)
        finally:
            server.stop()
