"""Fault soak: steady mixed traffic against a real server in Redis mode while every fault class
hits it in turn; counts the 5xx answers (the goal: none).

    python bench/fault_soak.py --duration 180

Starts a ``redis-server`` and ``shortlist serve`` (tokens set, short body bounds), uploads the
demo registry, then runs three clients (queries with feedback; small synchronous writes and
deletes; large uploads answered 202 and polled) while a fault thread cycles through:

- slow bodies: 40 connections without a token and 10 with one, each trickling a body a byte
  at a time (the first are refused before the body, the others cut by the minimum rate);
- kill -9 during a job: a large upload is accepted, the server is killed within 1.5 s and
  started again on the same port (clients pause until ``/readyz`` answers, as a load
  balancer would; requests cut by the kill are counted apart, not as 5xx);
- corrupt caches: random bytes written over cached embedding vectors in Redis;
- wiped Redis: ``FLUSHALL`` under load.

Prints per fault the requests and 5xx seen while it was active, the 5xx total, the first 5xx
bodies, acknowledged jobs that were lost (404 after a restart) and any answer that was not
valid JSON.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import random
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_EMBEDDER_CACHE, ROOT, Server, free_port, redis_server

ADMIN = "fault-soak-admin-token-0123456789"
QUERY = "fault-soak-query-token-0123456789"
QUERIES = ["weather in Paris tomorrow", "convert 20 euros to yen", "send an email to Bob",
           "book a table for two tonight", "what's on my calendar", "translate hello to French"]


def demo_tools() -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = json.loads((ROOT / "examples" / "demo_tools.json").read_text())["tools"]
    return tools


class Tally:
    """Answers by fault phase and status class, 5xx bodies, transport errors."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.phase = "steady"
        self.by_phase: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.fivexx: list[str] = []
        self.invalid_json = 0
        self.cut = 0  # transport errors (the server was being killed)

    def record(self, what: str, r: httpx.Response) -> None:
        with self.lock:
            counts = self.by_phase[self.phase]
            counts["requests"] += 1
            if r.status_code >= 500:
                counts["5xx"] += 1
                self.fivexx.append(f"[{self.phase}] {what} {r.status_code} {r.text[:200]}")
            if r.headers.get("content-type", "").startswith("application/json") and r.content:
                try:
                    json.loads(r.content)
                except ValueError:
                    self.invalid_json += 1

    def transport_error(self) -> None:
        with self.lock:
            self.cut += 1


class Soak:
    def __init__(self, args: argparse.Namespace, redis_url: str, data_dir: Path) -> None:
        self.args = args
        self.redis_url = redis_url
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.up = threading.Event()  # clients send only while the server is up and ready
        self.stop = threading.Event()
        self.tally = Tally()
        self.jobs: list[tuple[str, float]] = []  # acknowledged job URLs, when
        self.kills: list[float] = []
        self.wipes: list[float] = []
        self.jobs_lock = threading.Lock()
        self.server: Server | None = None
        self.restarts = 0
        self.upload_n = 0

    # -- the server -------------------------------------------------------------------------

    def start(self) -> None:
        self.server = Server(
            self.args.embedder_cache, self.data_dir / "data", root=ROOT,
            log_path=self.data_dir / f"server-{self.restarts}.log",
            port=str(self.port), redis_url=self.redis_url, redis_prefix="soak:",
            admin_token=ADMIN, query_token=QUERY, async_write_min_texts="16",
            body_timeout_seconds="5", body_min_bytes_per_second="1024",
            sync_interval_seconds="0.5", job_lease_seconds="2",
        )
        self.server.url = self.url  # the port given above, not the one Server picked
        self.server.wait_ready()
        self.up.set()

    def kill_and_restart(self) -> None:
        assert self.server is not None
        self.up.clear()
        self.server.stop(kill=True)
        self.kills.append(time.monotonic())
        self.restarts += 1
        time.sleep(0.5)
        self.start()

    # -- clients ----------------------------------------------------------------------------

    def call(self, client: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
        self.up.wait()
        try:
            r = client.request(method, path, **kwargs)
        except httpx.TransportError:
            self.tally.transport_error()
            return None
        self.tally.record(f"{method} {path.split('?')[0]}", r)
        return r

    def queries(self) -> None:
        auth = {"authorization": f"Bearer {QUERY}"}
        with httpx.Client(base_url=self.url, timeout=30, headers=auth) as c:
            i = 0
            while not self.stop.is_set():
                i += 1
                r = self.call(c, "POST", "/shortlist", json={"registry": "base", "query": QUERIES[i % len(QUERIES)]})
                if r is not None and r.status_code == 200 and i % 4 == 0:
                    body = r.json()
                    if body["tools"]:
                        self.call(c, "POST", "/feedback",
                                  json={"shortlist_id": body["shortlist_id"], "used": [body["tools"][0]["name"]]})

    def writes(self) -> None:
        auth = {"authorization": f"Bearer {ADMIN}"}
        demo = demo_tools()
        rng = random.Random(1)
        with httpx.Client(base_url=self.url, timeout=60, headers=auth) as c:
            while not self.stop.is_set():
                r = self.call(c, "GET", "/registries/base")
                if r is not None and r.status_code == 404:
                    self.call(c, "PUT", "/registries/base", json=demo)
                name = f"w{rng.randrange(3)}"
                choice = rng.random()
                if choice < 0.5:
                    self.call(c, "PUT", f"/registries/{name}", json=demo[: rng.randint(2, 6)])
                elif choice < 0.75:
                    self.call(c, "POST", f"/registries/{name}/tools", json={"tools": demo[:2]})
                else:
                    self.call(c, "DELETE", f"/registries/{name}")
                time.sleep(0.05)

    def uploads(self) -> None:
        while not self.stop.is_set():
            self.upload()
            time.sleep(1.0)

    def upload(self) -> None:
        """A large upload (new texts: a 202 job), remembered to check after restarts."""
        auth = {"authorization": f"Bearer {ADMIN}"}
        with self.jobs_lock:
            self.upload_n += 1
            n = self.upload_n
        tools = [{"name": f"u{n}_t{j}", "description": f"upload {n} tool {j}: "
                  + " ".join(f"word{(n * 131 + j * 17 + w) % 997}" for w in range(20))} for j in range(24)]
        with httpx.Client(base_url=self.url, timeout=60, headers=auth) as c:
            r = self.call(c, "PUT", f"/registries/big{n % 4}", json=tools)
        if r is not None and r.status_code == 202:
            with self.jobs_lock:
                self.jobs.append((r.headers["location"], time.monotonic()))

    # -- faults -----------------------------------------------------------------------------

    def slow_bodies(self) -> None:
        socks = []
        for i in range(50):
            token = f"authorization: Bearer {QUERY}\r\n" if i % 5 == 0 else ""
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                s.sendall((f"POST /shortlist HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                           f"content-length: 100000\r\n{token}\r\n").encode())
                socks.append(s)
            except OSError:
                pass
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline and not self.stop.is_set():
            for s in socks:
                with contextlib.suppress(OSError):
                    s.sendall(b" ")
            time.sleep(0.5)
        for s in socks:
            s.close()

    def kill_during_job(self) -> None:
        threading.Thread(target=self.upload, daemon=True).start()
        time.sleep(random.uniform(0.2, 1.5))
        self.kill_and_restart()

    def corrupt_caches(self) -> None:
        import redis

        client = redis.Redis.from_url(self.redis_url)
        rng = random.Random()
        for key in client.scan_iter("soak:embeddings:*"):
            fields = client.hkeys(key)
            for field in rng.sample(fields, min(5, len(fields))):
                client.hset(key, field, rng.randbytes(rng.choice([7, 1536])))
        time.sleep(5)

    def wipe_redis(self) -> None:
        import redis

        redis.Redis.from_url(self.redis_url).flushall()
        self.wipes.append(time.monotonic())
        time.sleep(5)

    def faults(self) -> None:
        cycle = [("slow bodies", self.slow_bodies), ("kill -9 during a job", self.kill_during_job),
                 ("corrupt caches", self.corrupt_caches), ("wiped Redis", self.wipe_redis)]
        i = 0
        while not self.stop.is_set():
            name, fault = cycle[i % len(cycle)]
            i += 1
            with self.tally.lock:
                self.tally.phase = name
            fault()
            with self.tally.lock:
                self.tally.phase = "steady"
            self.stop.wait(self.args.pause)

    def lost_jobs(self) -> tuple[int, int]:
        """Acknowledged jobs no longer answered (404): those no live process held when Redis
        was wiped (killed before the wipe: their record existed only in the wiped Redis), and
        the others (should be none)."""
        auth = {"authorization": f"Bearer {ADMIN}"}
        expected = unexpected = 0
        with httpx.Client(base_url=self.url, timeout=30, headers=auth) as c:
            for url, acked in self.jobs:
                if c.get(url).status_code != 404:
                    continue
                orphaned = any(k > acked and any(w > k for w in self.wipes) for k in self.kills)
                expected += orphaned
                unexpected += not orphaned
        return expected, unexpected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of traffic")
    parser.add_argument("--pause", type=float, default=5.0, help="seconds of steady traffic between faults")
    parser.add_argument("--embedder-cache", type=Path, default=DEFAULT_EMBEDDER_CACHE)
    parser.add_argument("--workdir", type=Path, default=None, help="keep server logs here")
    args = parser.parse_args()

    import tempfile

    with tempfile.TemporaryDirectory() as tmp, redis_server() as redis_url:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        soak = Soak(args, redis_url, work)
        soak.start()
        demo = demo_tools()
        httpx.put(f"{soak.url}/registries/base", json=demo, headers={"authorization": f"Bearer {ADMIN}"},
                  timeout=60).raise_for_status()
        threads = [threading.Thread(target=t, daemon=True) for t in (soak.queries, soak.writes, soak.uploads)]
        faults = threading.Thread(target=soak.faults, daemon=True)
        for t in (*threads, faults):
            t.start()
        soak.stop.wait(args.duration)
        soak.stop.set()
        faults.join(120)
        for t in threads:
            t.join(60)
        soak.up.set()
        lost = soak.lost_jobs()
        assert soak.server is not None
        soak.server.stop()
    tally = soak.tally
    total = sum(c["requests"] for c in tally.by_phase.values())
    errors = sum(c["5xx"] for c in tally.by_phase.values())
    print(f"{'phase':24s} {'requests':>9s} {'5xx':>5s}")
    for phase, counts in sorted(tally.by_phase.items()):
        print(f"{phase:24s} {counts['requests']:9d} {counts['5xx']:5d}")
    print(f"\n{total} requests in {args.duration:.0f} s, {soak.restarts} kill -9 restarts, "
          f"{errors} 5xx, {tally.cut} cut by a kill, {tally.invalid_json} invalid JSON bodies, "
          f"{len(soak.jobs)} jobs acknowledged; unknown at the end: {lost[0]} whose process was killed "
          f"before a wipe of Redis, {lost[1]} others")
    for line in tally.fivexx[:10]:
        print("  ", line)


if __name__ == "__main__":
    main()
