"""Other users' /shortlist latency while 50 refits are queued (issue 23 item 4), before/after.

    python bench/refit_load.py --baseline cc09328 [--events-per-registry 300] [--registries 50]

For each checkout (the baseline revision in a temporary git worktree, then this one): a fresh
data directory gets ``--registries`` registries r0.. and a query registry ``q`` (the same
tools, real MiniLM), one real shortlist + feedback round per registry through HTTP, then a
feedback log of ``--events-per-registry`` events per registry (those real events copied with
new shortlist ids, so every refit has data and the log is realistic in size). The server is
restarted on it and measured: /shortlist p50/p99 on ``q`` idle, then while ``--registries``
async refits are posted at once (until all are final), with the server's peak thread count and
RSS. Prints one table; the idle figures are each run's own baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_EMBEDDER_CACHE, ROOT, Server, rss_mib, worktree

QUERIES = ("weather in Lisbon this weekend", "send an email to my boss", "convert 20 euros to dollars",
           "read the config file", "book a table for two", "what is the time in Tokyo")

JSON = {"content-type": "application/json"}  # refits are writes: JSON only


def tools() -> list[dict]:
    words = ("weather", "email", "currency", "file", "calendar", "restaurant", "flight", "music",
             "maps", "news", "stocks", "translate", "timer", "notes", "photos", "contacts")
    return [{"name": f"{w}_{i}", "description": f"{w} tool {i}: does {w} things, variant {i}"}
            for w in words for i in range(4)]


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


@contextlib.contextmanager
def server_for(root: Path, data_dir: Path, cache: Path, log: Path, **settings: str):
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{root}:{root / 'client' / 'src'}"  # serve that checkout's code
    try:
        server = Server(cache, data_dir, log_path=log, root=root, **settings)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def prepare(root: Path, data_dir: Path, cache: Path, registries: int, per_registry: int, log: Path) -> int:
    with server_for(root, data_dir, cache, log) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        for name in ["q", *(f"r{i}" for i in range(registries))]:
            c.put(f"/registries/{name}", json=tools()).raise_for_status()
        for i in range(registries):
            for query in QUERIES:
                s = c.post("/shortlist", json={"registry": f"r{i}", "query": query}).json()
                c.post("/feedback", json={"shortlist_id": s["shortlist_id"], "used": [s["tools"][0]["name"]]})
    path = data_dir / "feedback" / "events.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    real = [e for e in lines if "shortlist_id" in e]
    with open(path, "w") as out:
        for header in (e for e in lines if "shortlist_id" not in e):
            out.write(json.dumps(header) + "\n")
        for i in range(registries):
            mine = [e for e in real if e["registry"] == f"r{i}"] or real
            for j in range(per_registry):
                out.write(json.dumps({**mine[j % len(mine)], "shortlist_id": uuid.uuid4().hex}) + "\n")
    return registries * per_registry


def measure(root: Path, data_dir: Path, cache: Path, registries: int, log: Path) -> dict[str, float]:
    settings = {"refit_queue_max": str(registries + 4), "refit_min_events": "10"}
    with server_for(root, data_dir, cache, log, **settings) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        def timed(n: int, stop: threading.Event | None = None) -> list[float]:
            out = []
            for i in range(n):
                if stop is not None and stop.is_set():
                    break
                t = time.perf_counter()
                c.post("/shortlist", json={"registry": "q", "query": QUERIES[i % len(QUERIES)]}).raise_for_status()
                out.append((time.perf_counter() - t) * 1000)
            return out

        timed(20)
        idle = timed(200)
        started = time.monotonic()
        jobs = []
        with httpx.Client(base_url=server.url, timeout=300) as admin:
            for i in range(registries):
                r = admin.post(f"/registries/r{i}/policies/refit?async=true", headers=JSON)
                jobs.append((f"r{i}", r.json().get("job")) if r.status_code == 202 else (f"r{i}", None))
            stop = threading.Event()
            peak = {"threads": threads(server.pid), "rss": rss_mib(server.pid)}

            def watch() -> None:
                while not stop.is_set():
                    pending = 0
                    for name, job in jobs:
                        if job is None:
                            continue
                        state = admin.get(f"/registries/{name}/policies/refit/{job}").json().get("state")
                        pending += state in ("queued", "running")
                    peak["threads"] = max(peak["threads"], threads(server.pid))
                    peak["rss"] = max(peak["rss"], rss_mib(server.pid))
                    if pending == 0 or time.monotonic() - started > 600:
                        stop.set()
                    time.sleep(0.5)

            watcher = threading.Thread(target=watch)
            watcher.start()
            during: list[float] = []
            while not stop.is_set():
                during += timed(50, stop)
            watcher.join()
        return {
            "idle_p50": float(np.percentile(idle, 50)), "idle_p99": float(np.percentile(idle, 99)),
            "during_p50": float(np.percentile(during, 50)) if during else float("nan"),
            "during_p99": float(np.percentile(during, 99)) if during else float("nan"),
            "queries": len(during), "refits_s": time.monotonic() - started,
            "accepted": sum(job is not None for _, job in jobs),
            "threads": peak["threads"], "rss": peak["rss"],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=None, help="git revision to compare with (before)")
    parser.add_argument("--registries", type=int, default=50)
    parser.add_argument("--events-per-registry", type=int, default=300)
    parser.add_argument("--embedder-cache", type=Path, default=DEFAULT_EMBEDDER_CACHE)
    args = parser.parse_args()
    rows = []
    with contextlib.ExitStack() as stack:
        runs = [("after (this checkout)", ROOT)]
        if args.baseline:
            runs.insert(0, (f"before ({args.baseline})", stack.enter_context(worktree(args.baseline))))
        for label, root in runs:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            events = prepare(root, tmp / "data", args.embedder_cache, args.registries,
                             args.events_per_registry, tmp / "prepare.log")
            print(f"{label}: {events} feedback events over {args.registries} registries", flush=True)
            rows.append((label, measure(root, tmp / "data", args.embedder_cache, args.registries, tmp / "measure.log")))
    print(f"\n{'run':28} {'idle p50':>9} {'idle p99':>9} {'during p50':>11} {'during p99':>11} "
          f"{'queries':>8} {'refits':>7} {'all final':>10} {'threads':>8} {'RSS MiB':>8}")
    for label, m in rows:
        print(f"{label:28} {m['idle_p50']:9.1f} {m['idle_p99']:9.1f} {m['during_p50']:11.1f} "
              f"{m['during_p99']:11.1f} {m['queries']:8d} {m['accepted']:7d} {m['refits_s']:9.1f}s "
              f"{m['threads']:8d} {m['rss']:8.0f}")
    print("(latencies in ms; 'all final': seconds from posting the refits until every one was final)")


if __name__ == "__main__":
    main()
