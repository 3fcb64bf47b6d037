"""Harvest the tool lists of real MCP servers published on npm.

    python bench/mcp/harvest.py [--only server-slack,firecrawl] [--cache data/mcp_npm]

For every pinned package in SERVERS: ``npm install --prefix <cache>/<stem> --ignore-scripts``,
start the server with node over stdio (dummy API keys in its environment, a scratch directory
for servers that take one), speak raw JSON-RPC (initialize, notifications/initialized,
tools/list, following ``nextCursor``), then kill the server's whole process group. Each
harvest is written to ``bench/data/mcp_registries/<stem>.json`` as
``{"server", "package", "version", "tools": [{name, description, inputSchema}, ...]}``.
Failures are reported and skipped; nothing else is touched.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "bench" / "data" / "mcp_registries"
DEFAULT_CACHE = ROOT / "data" / "mcp_npm"
PROTOCOL_VERSION = "2024-11-05"
DUMMY = "dummy-key-for-tool-listing"


@dataclass(frozen=True)
class Server:
    """One npm-published MCP server: where it lives and how to start it."""

    stem: str
    package: str
    version: str
    args: tuple[str, ...] = ()  # "{tmp}" is replaced by a scratch directory
    env: dict[str, str] = field(default_factory=dict)
    bin: str | None = None  # the package's bin entry, when it has several


SERVERS: tuple[Server, ...] = (
    Server("filesystem", "@modelcontextprotocol/server-filesystem", "2026.8.31", ("{tmp}",)),
    Server("memory", "@modelcontextprotocol/server-memory", "2026.8.31",
           env={"MEMORY_FILE_PATH": "{tmp}/memory.json"}),
    Server("everything", "@modelcontextprotocol/server-everything", "2026.8.31", ("stdio",)),
    Server("github", "@modelcontextprotocol/server-github", "2025.4.8",
           env={"GITHUB_PERSONAL_ACCESS_TOKEN": DUMMY}),
    Server("gitlab", "@modelcontextprotocol/server-gitlab", "2025.4.25",
           env={"GITLAB_PERSONAL_ACCESS_TOKEN": DUMMY,
                "GITLAB_API_URL": "http://127.0.0.1:9/api/v4"}),
    Server("slack", "@modelcontextprotocol/server-slack", "2025.4.25",
           env={"SLACK_BOT_TOKEN": "xoxb-" + DUMMY, "SLACK_TEAM_ID": "T00000000"}),
    Server("brave-search", "@modelcontextprotocol/server-brave-search", "0.6.2",
           env={"BRAVE_API_KEY": DUMMY}),
    Server("google-maps", "@modelcontextprotocol/server-google-maps", "0.6.2",
           env={"GOOGLE_MAPS_API_KEY": DUMMY}),
    Server("puppeteer", "@modelcontextprotocol/server-puppeteer", "2025.5.12"),
    Server("postgres", "@modelcontextprotocol/server-postgres", "0.6.2",
           ("postgresql://user:pass@127.0.0.1:9/db",)),
    Server("redis", "@modelcontextprotocol/server-redis", "2025.4.25", ("redis://127.0.0.1:9",)),
    Server("sequential-thinking", "@modelcontextprotocol/server-sequential-thinking", "2026.8.31"),
    Server("everart", "@modelcontextprotocol/server-everart", "0.6.2",
           env={"EVERART_API_KEY": DUMMY}),
    Server("playwright", "@playwright/mcp", "0.0.83"),
    Server("notion", "@notionhq/notion-mcp-server", "2.5.2", env={"NOTION_TOKEN": DUMMY}),
    Server("firecrawl", "firecrawl-mcp", "3.26.0", env={"FIRECRAWL_API_KEY": "fc-" + DUMMY}),
    Server("tavily", "tavily-mcp", "0.2.22", env={"TAVILY_API_KEY": "tvly-" + DUMMY}),
    Server("exa", "exa-mcp-server", "3.4.1", env={"EXA_API_KEY": DUMMY}),
    Server("context7", "@upstash/context7-mcp", "4.1.1"),
    Server("desktop-commander", "@wonderwhy-er/desktop-commander", "0.2.52", bin="desktop-commander"),
)


class HarvestError(RuntimeError):
    """A server could not be installed, started or listed."""


def install(server: Server, cache: Path) -> Path:
    """Install the pinned package into its own prefix; return the path of its entry script."""
    prefix = cache / server.stem
    prefix.mkdir(parents=True, exist_ok=True)
    pkg_dir = prefix / "node_modules" / server.package
    manifest = pkg_dir / "package.json"
    installed = json.loads(manifest.read_text()).get("version") if manifest.exists() else None
    if installed != server.version:
        cmd = ["npm", "install", "--prefix", str(prefix), "--ignore-scripts", "--no-audit",
               "--no-fund", "--loglevel=error", f"{server.package}@{server.version}"]
        env = dict(os.environ, PUPPETEER_SKIP_DOWNLOAD="1", PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD="1")
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=900, env=env, check=False
        )
        if done.returncode != 0:
            raise HarvestError(f"npm install failed: {done.stderr.strip()[-500:]}")
    meta = json.loads(manifest.read_text())
    bins = meta.get("bin")
    if isinstance(bins, str):
        entry = bins
    elif isinstance(bins, dict) and bins:
        entry = bins[server.bin] if server.bin else next(iter(bins.values()))
    elif meta.get("main"):
        entry = meta["main"]
    else:
        raise HarvestError("package has neither bin nor main")
    return pkg_dir / entry


class StdioRpc:
    """Newline-delimited JSON-RPC with a child process; every read is time-bounded."""

    def __init__(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        self.proc = proc
        self.deadline = deadline
        self.buffer = b""
        self.next_id = 1

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        rid = self.next_id
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            message = self._read()
            if message.get("id") == rid and "method" not in message:
                if "error" in message:
                    raise HarvestError(f"{method}: {message['error']}")
                return message.get("result") or {}
            if "method" in message and "id" in message:  # a server-to-client request: decline
                self.send({"jsonrpc": "2.0", "id": message["id"],
                           "error": {"code": -32601, "message": "not supported"}})

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a stray log line on stdout
                if isinstance(message, dict):
                    return message
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise HarvestError("timed out waiting for the server")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise HarvestError(f"server closed stdout (exit {self.proc.poll()})")
                self.buffer += chunk


def list_tools(server: Server, entry: Path, timeout: float) -> list[dict[str, Any]]:
    """Start the server, list its tools, and kill its process group whatever happens."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [a.replace("{tmp}", tmp) for a in server.args]
        env = dict(os.environ, **{k: v.replace("{tmp}", tmp) for k, v in server.env.items()})
        with open(Path(tmp) / "stderr.log", "wb") as err:
            proc = subprocess.Popen(["node", str(entry), *args], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, env=env, cwd=tmp,
                                    start_new_session=True)
            try:
                rpc = StdioRpc(proc, time.monotonic() + timeout)
                rpc.request("initialize", {
                    "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                    "clientInfo": {"name": "tool-shortlist-harvest", "version": "1"}})
                rpc.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
                tools: list[dict[str, Any]] = []
                cursor: str | None = None
                while True:
                    result = rpc.request("tools/list", {"cursor": cursor} if cursor else {})
                    tools.extend(result.get("tools") or [])
                    cursor = result.get("nextCursor")
                    if not cursor:
                        return tools
            except HarvestError as exc:
                tail = (Path(tmp) / "stderr.log").read_text(errors="replace").strip()[-300:]
                raise HarvestError(f"{exc}; stderr: {tail}") from None
            finally:
                _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(3)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def harvest(server: Server, cache: Path, timeout: float) -> dict[str, Any]:
    entry = install(server, cache)
    raw = list_tools(server, entry, timeout)
    if not raw:
        raise HarvestError("server listed no tools")
    tools = [{"name": t["name"], "description": t.get("description", ""),
              "inputSchema": t.get("inputSchema") or {"type": "object"}} for t in raw]
    return {"server": server.stem, "package": server.package, "version": server.version,
            "harvested": datetime.date.today().isoformat(), "tools": tools}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated stems (default: all)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per server run")
    args = parser.parse_args()
    wanted = {s for s in args.only.split(",") if s}
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for server in SERVERS:
        if wanted and server.stem not in wanted:
            continue
        started = time.monotonic()
        try:
            record = harvest(server, args.cache, args.timeout)
        except (HarvestError, subprocess.TimeoutExpired, OSError, KeyError) as exc:
            failed.append(server.stem)
            print(f"FAIL {server.package}@{server.version}: {exc}", flush=True)
            continue
        path = args.out / f"{server.stem}.json"
        path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        print(f"ok   {server.package}@{server.version}: {len(record['tools'])} tools "
              f"({time.monotonic() - started:.0f} s) -> {path}", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
