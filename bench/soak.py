"""Soak: a steady request rate against the real server for a while, RSS sampled every 10 s.

    python bench/soak.py --data-root ../shared/data --rate 100 --duration 600 --tools 4000

Starts `shortlist serve`, uploads an N-tool registry (real tools topped up with synthetic ones,
as in bench/perf.py), then sends POST /shortlist at a fixed rate (open loop, 4 sender threads;
every 10th shortlist also gets a POST /feedback) for the given duration, bounded in time and
count. Prints RSS every 10 s, the error count, latency percentiles, and whether RSS stayed
flat (growth over the second half of the run).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    DEFAULT_EMBEDDER_CACHE,
    ROOT,
    real_queries,
    real_tools,
    rss_mib,
    serve,
    synthetic_tools,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds")
    parser.add_argument("--tools", type=int, default=4000)
    parser.add_argument("--embedder-cache", type=Path, default=DEFAULT_EMBEDDER_CACHE)
    parser.add_argument(
        "--setting", action="append", default=[], metavar="NAME=VALUE",
        help="extra server setting, e.g. feedback_retention_seconds=60 (repeatable)",
    )
    args = parser.parse_args()

    pool = real_tools(args.data_root)
    tools = pool[: args.tools] + synthetic_tools(max(0, args.tools - len(pool)))
    queries = real_queries(args.data_root)
    settings = dict(item.split("=", 1) for item in args.setting)
    with serve(args.embedder_cache, **settings) as server:
        url = server.url
        with httpx.Client(base_url=url, timeout=600) as client:
            client.put("/registries/soak", json=tools).raise_for_status()
            latencies: list[float] = []
            errors = [0]
            lock = threading.Lock()
            start = time.monotonic()
            total = int(args.rate * args.duration)
            next_index = [0]

            def sender() -> None:
                with httpx.Client(base_url=url, timeout=10) as c:
                    while True:
                        with lock:
                            i = next_index[0]
                            next_index[0] += 1
                        if i >= total:
                            return
                        due = start + i / args.rate
                        delay = due - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                        t0 = time.perf_counter()
                        try:
                            r = c.post("/shortlist", json={"registry": "soak", "query": queries[i % len(queries)]})
                            ok = r.status_code == 200
                            if ok and i % 10 == 0:
                                body = r.json()
                                used = [body["tools"][0]["name"]] if body["tools"] else []
                                if used:
                                    c.post("/feedback", json={"shortlist_id": body["shortlist_id"], "used": used})
                        except httpx.HTTPError:
                            ok = False
                        with lock:
                            latencies.append(time.perf_counter() - t0)
                            if not ok:
                                errors[0] += 1

            threads = [threading.Thread(target=sender, daemon=True) for _ in range(4)]
            for t in threads:
                t.start()
            samples = []
            print("  t(s)  RSS(MB)  requests")
            while any(t.is_alive() for t in threads):
                time.sleep(10)
                samples.append((time.monotonic() - start, rss_mib(server.pid)))
                print(f"{samples[-1][0]:6.0f}  {samples[-1][1]:7.1f}  {len(latencies):8d}", flush=True)
    arr = np.array(latencies) * 1000
    half = [rss for t, rss in samples if t >= samples[-1][0] / 2]
    print(f"\n{len(latencies)} requests in {samples[-1][0]:.0f} s ({len(latencies) / samples[-1][0]:.0f}/s), "
          f"errors {errors[0]}, p50 {np.percentile(arr, 50):.1f} ms, p99 {np.percentile(arr, 99):.1f} ms")
    print(f"RSS first sample {samples[0][1]:.0f} MB, last {samples[-1][1]:.0f} MB, "
          f"second-half growth {half[-1] - half[0]:+.1f} MB")


if __name__ == "__main__":
    main()
