"""Writes at scale (issue 14 item 9), before/after in one run.

    python bench/upsert.py local  --tools 4000 --baseline e3f60d5~1     # one-tool writes, MiniLM
    python bench/upsert.py redis  --tools 4000 --writers 8 --baseline e3f60d5~1
    python bench/upsert.py upload --tools 5000 --desc-chars 2400        # 12 MB upload, RSS
    python bench/upsert.py hnsw   --tools 100000                        # HNSW derive vs rebuild

``local``: an engine on a local store with the real MiniLM (vectors of the registry pre-cached,
as in a running service) times one-tool upserts (a new tool), updates (a changed description)
and deletes into a ``--tools`` registry, end to end (parse, embed the new text, BM25, FAISS,
store write). With ``--baseline REV`` the same runs in a child process on a worktree of REV.

``redis``: a fresh redis-server and two replicas (``shortlist serve``); ``--writers`` threads
each POST ``--writes`` one-tool upserts of new tools, alternating replicas; latency p50/p99/max
and failed writes. With ``--baseline`` the same against replicas of REV (vectors pre-cached in
Redis for both, so neither measures the first embedding of the registry).

``upload``: one ``shortlist serve`` on a local store; PUT ``--tools`` tools with long
descriptions; the answer's status and time, the time until the version is served, and the
server's RSS (sampled every 0.25 s, and its high-water mark).

``hnsw``: the HNSW derive-vs-rebuild measurement (hashing embedder, 100,000 tools).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from common import DEFAULT_EMBEDDER_CACHE, Server, redis_server, synthetic_tools, worktree  # noqa: E402

CACHE = Path(tempfile.gettempdir()) / "shortlist-bench-upsert"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


# -- vectors of the registry, computed once and reused by every run and revision ------------


def ensure_vectors(n: int) -> Path:
    """MiniLM vectors of ``synthetic_tools(n)`` (content hash -> vector), computed once into an
    .npz that every run and revision reads (the registry is pre-cached, as in a running service)."""
    sys.path.insert(0, str(ROOT))
    from registry.index.embedders import load_minilm
    from registry.tools import ToolLimits, parse_tools

    embedder = load_minilm(DEFAULT_EMBEDDER_CACHE)
    key = hashlib.sha256(f"{embedder.model_id}/{n}".encode()).hexdigest()[:16]
    path = CACHE / f"{key}.npz"
    if not path.exists():
        print(f"embedding {n} tools once (cached in {path})...", file=sys.stderr)
        tools = parse_tools(synthetic_tools(n), ToolLimits(max_tools=n + 10))
        vectors = embedder.embed_documents([t.text() for t in tools])
        CACHE.mkdir(exist_ok=True)
        np.savez(path, hashes=np.array([t.content_hash() for t in tools]), vectors=vectors,
                 model_id=np.array(embedder.model_id))
    return path


def load_vectors(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    data = np.load(path)
    return str(data["model_id"]), dict(zip(data["hashes"].tolist(), data["vectors"]))


# -- local: one-tool writes in-process -----------------------------------------------------


def local_child(root: Path, n: int, repeat: int, vectors_path: Path) -> dict[str, object]:
    """Runs inside a process whose ``registry`` package is ``root``'s."""
    model_id, vectors = load_vectors(vectors_path)
    sys.path.insert(0, str(root))
    from registry.assembly import Registries
    from registry.index.embedders import load_minilm
    from registry.serving.depth_policies import OnnxDepthPolicy
    from registry.settings import Settings
    from registry.store.local import LocalStore

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), demo_registry=None, max_tools_per_registry=n + 10 * repeat + 10)
        store = LocalStore(settings.data_dir)
        embedder = load_minilm(DEFAULT_EMBEDDER_CACHE)
        assert embedder.model_id == model_id
        store.put_embeddings(model_id, vectors)
        engine = Registries.build(settings, store, embedder, OnnxDepthPolicy.from_dir(root / "models" / "default"))
        t0 = time.perf_counter()
        engine.writer.put_registry("big", synthetic_tools(n))
        initial = time.perf_counter() - t0
        times: dict[str, list[float]] = {"upsert": [], "update": [], "delete": []}
        names = [t.name for t in engine.snapshots.snapshot("big").tools]
        for i in range(repeat):
            stamp = f"{i} {time.time_ns()}"  # a text no cache has seen
            writes = {
                "upsert": ("upsert", [{"name": f"new_{stamp}", "description": f"counts zebras {stamp}"}]),
                "update": ("upsert", [{"name": names[i], "description": f"changed text {stamp}"}]),
                "delete": ("delete", names[-1 - i]),
            }
            for kind, (call, arg) in writes.items():
                t0 = time.perf_counter()
                if call == "upsert":
                    engine.writer.upsert_tools("big", arg)
                else:
                    engine.writer.delete_tool("big", arg)
                times[kind].append(time.perf_counter() - t0)
    out: dict[str, object] = {"initial_s": initial}
    for kind, values in times.items():
        out[kind] = {"p50_ms": 1000 * statistics.median(values), "max_ms": 1000 * max(values)}
    return out


def run_local(args: argparse.Namespace) -> None:
    vectors = ensure_vectors(args.tools)  # once, before any timed run
    runs = [("after (this checkout)", ROOT)]
    with contextlib.ExitStack() as stack:
        if args.baseline:
            runs.append((f"before ({args.baseline})", stack.enter_context(worktree(args.baseline))))
        rows = []
        for label, root in runs:
            proc = subprocess.run(
                [sys.executable, __file__, "local-child", "--root", str(root), "--tools", str(args.tools),
                 "--repeat", str(args.repeat), "--vectors", str(vectors)],
                capture_output=True, text=True, check=True,
            )
            rows.append((label, json.loads(proc.stdout.strip().splitlines()[-1])))
    print(f"\n| one-tool write into {args.tools:,} tools (MiniLM, local store, {args.repeat} each) "
          "| upsert p50 / max ms | update p50 / max ms | delete p50 / max ms |\n|---|---|---|---|")
    for label, r in rows:
        cells = " | ".join(f"{r[k]['p50_ms']:.0f} / {r[k]['max_ms']:.0f}" for k in ("upsert", "update", "delete"))
        print(f"| {label} | {cells} |")


# -- redis: concurrent writers on two replicas ---------------------------------------------


def put_and_wait(
    client, url: str, tools: list[dict], patience: float = 900, max_wait: float = 3600
) -> tuple[int | str, float, float]:
    """PUT; poll a 202's job (at most ``max_wait`` s). Returns (status, seconds to answer,
    seconds until the version is served: nan when the job had not finished)."""
    t0 = time.perf_counter()
    r = client.put(f"{url}/registries/big", json=tools, timeout=patience)
    answered = time.perf_counter() - t0
    if r.status_code == 202:
        location = r.headers["location"]
        while (state := client.get(f"{url}{location}", timeout=30).json()["state"]) in ("queued", "running"):
            if time.perf_counter() - t0 > max_wait:
                return r.status_code, answered, float("nan")
            time.sleep(0.25)
        if state != "done":
            raise RuntimeError(f"upload job {state}")
    elif r.status_code != 200:
        raise RuntimeError(f"PUT answered {r.status_code}: {r.text[:300]}")
    return r.status_code, answered, time.perf_counter() - t0


def redis_round(root: Path, args: argparse.Namespace, model_id: str, vectors: dict[str, np.ndarray]) -> dict[str, object]:
    import httpx
    import redis

    with redis_server() as url, tempfile.TemporaryDirectory() as tmp:
        prefix = "bench:"
        client = redis.Redis.from_url(url)
        key = prefix + "embeddings:" + hashlib.sha256(model_id.encode()).hexdigest()[:24]
        items = [(bytes.fromhex(h), np.asarray(v, dtype=np.float32).tobytes()) for h, v in vectors.items()]
        for start in range(0, len(items), 2000):
            client.hset(key, mapping=dict(items[start : start + 2000]))
        servers = [Server(DEFAULT_EMBEDDER_CACHE, Path(tmp) / f"r{i}", root=root, log_path=Path(tmp) / f"r{i}.log",
                          redis_url=url, redis_prefix=prefix, max_tools_per_registry=str(args.tools + 10_000))
                   for i in range(2)]
        try:
            for server in servers:
                server.wait_ready()
            http = httpx.Client()
            put_and_wait(http, servers[0].url, synthetic_tools(args.tools))
            while http.get(f"{servers[1].url}/registries/big").status_code != 200:
                time.sleep(0.1)
            latencies: list[float] = []
            statuses: dict[int, int] = {}
            lock = threading.Lock()

            def writer(w: int) -> None:
                with httpx.Client(timeout=120) as c:
                    for j in range(args.writes):
                        url_ = servers[(w + j) % 2].url
                        body = [{"name": f"w{w}_{j}", "description": f"writer {w} adds tool {j} {time.time_ns()}"}]
                        t0 = time.perf_counter()
                        r = c.post(f"{url_}/registries/big/tools", json=body)
                        took = time.perf_counter() - t0
                        with lock:
                            latencies.append(took)
                            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

            threads = [threading.Thread(target=writer, args=(w,)) for w in range(args.writers)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            deadline = time.monotonic() + 30  # replicas converge (the last writes may be in flight)
            while True:
                finals = [http.get(f"{server.url}/registries/big").json() for server in servers]
                if finals[0]["version"] == finals[1]["version"] or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            final = finals[0]
        finally:
            for server in servers:
                server.stop()
    ok = statuses.get(200, 0)
    return {
        "writes": len(latencies), "failed": len(latencies) - ok, "statuses": statuses,
        "p50_ms": 1000 * pct(latencies, 50), "p99_ms": 1000 * pct(latencies, 99),
        "max_ms": 1000 * max(latencies), "writes_per_s": len(latencies) / wall,
        "tools_after": len(final["tools"]), "expected_tools": args.tools + ok,
        "replicas_agree": finals[0]["version"] == finals[1]["version"],
    }


def run_redis(args: argparse.Namespace) -> None:
    model_id, vectors = load_vectors(ensure_vectors(args.tools))
    rows = []
    with contextlib.ExitStack() as stack:
        runs = [("after (this checkout)", ROOT)]
        if args.baseline:
            runs.append((f"before ({args.baseline})", stack.enter_context(worktree(args.baseline))))
        for label, root in runs:
            print(f"redis round: {label}", file=sys.stderr)
            rows.append((label, redis_round(root, args, model_id, vectors)))
    print(f"\n| {args.writers} writers x {args.writes} one-tool upserts, 2 replicas, Redis, {args.tools:,} tools "
          "| p50 ms | p99 ms | max ms | failed | writes/s | tools after (expected) |\n|---|---|---|---|---|---|---|")
    for label, r in rows:
        print(f"| {label} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['max_ms']:.0f} | {r['failed']} of {r['writes']} "
              f"{r['statuses']} | {r['writes_per_s']:.1f} | {r['tools_after']} ({r['expected_tools']}) |")


# -- upload: a large PUT, memory and time --------------------------------------------------


def long_tools(n: int, chars: int) -> list[dict]:
    tools = synthetic_tools(n)
    for i, tool in enumerate(tools):
        words = (tool["description"] + f" Variant {i}. ").split()
        text = []
        while sum(len(w) + 1 for w in text) < chars:
            text.extend(words)
        tool["description"] = " ".join(text)[:chars]
    return tools


def run_upload(args: argparse.Namespace) -> None:
    import httpx
    from common import rss_mib

    tools = long_tools(args.tools, args.desc_chars)
    size = len(json.dumps(tools).encode())
    runs = [("after (this checkout)", ROOT)]
    rows = []
    with contextlib.ExitStack() as stack:
        if args.baseline:
            runs.append((f"before ({args.baseline})", stack.enter_context(worktree(args.baseline))))
        for label, root in runs:
            with tempfile.TemporaryDirectory() as tmp:
                server = Server(DEFAULT_EMBEDDER_CACHE, Path(tmp), root=root, log_path=Path(tmp) / "log",
                                max_body_bytes=str(64 * 1024 * 1024))
                try:
                    server.wait_ready()
                    peak = [rss_mib(server.pid)]
                    start_rss = peak[0]
                    stop = threading.Event()

                    def sample(pid: int = server.pid, stop: threading.Event = stop, peak: list[float] = peak) -> None:
                        while not stop.wait(0.25):
                            with contextlib.suppress(OSError, ValueError):
                                peak.append(rss_mib(pid))

                    sampler = threading.Thread(target=sample, daemon=True)
                    sampler.start()
                    try:
                        status, answered, done = put_and_wait(
                            httpx.Client(), server.url, tools, patience=args.patience, max_wait=args.max_wait
                        )
                    except httpx.TimeoutException:  # the client gave up; the server is stopped below
                        status, answered, done = f"no answer in {args.patience:.0f} s", float("nan"), float("nan")
                    stop.set()
                    sampler.join()
                    hwm = next(int(line.split()[1]) / 1024 for line in Path(f"/proc/{server.pid}/status").read_text().splitlines()
                               if line.startswith("VmHWM:"))
                    rows.append((label, status, answered, done, start_rss, max(peak), hwm, rss_mib(server.pid)))
                    print(f"upload round {label}: {rows[-1][1:]}", file=sys.stderr)
                finally:
                    server.stop(kill=True)  # a baseline still building would not stop in time
    print(f"\n| PUT {args.tools:,} tools, {size / 1e6:.1f} MB | status | answered s | served s | RSS before MB "
          "| RSS peak (sampled / high-water) MB | RSS after MB |\n|---|---|---|---|---|---|---|")
    for label, status, answered, done, before, peak_, hwm, after in rows:
        print(f"| {label} | {status} | {answered:.1f} | {done:.1f} | {before:.0f} | {peak_:.0f} / {hwm:.0f} | {after:.0f} |")


# -- hnsw: derive the graph from the previous version vs rebuild ----------------------------


def run_hnsw(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from registry.assembly import Registries
    from registry.index.embed import HashingEmbedder
    from registry.index.snapshot import build_snapshot
    from registry.serving.depth_policies import OnnxDepthPolicy
    from registry.settings import Settings
    from registry.store.local import LocalStore
    from registry.tools import ToolLimits, parse_tools

    def best(fn, repeat: int) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    tools = synthetic_tools(args.tools)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), demo_registry=None, max_tools_per_registry=args.tools + 10)
        embedder = HashingEmbedder()
        engine = Registries.build(settings, LocalStore(settings.data_dir), embedder,
                                 OnnxDepthPolicy.from_dir(ROOT / "models" / "default"))
        engine.writer.put_registry("big", tools)
        counter = iter(range(10**6))
        upsert = best(lambda: engine.writer.upsert_tools(
            "big", [{"name": f"new_tool_{next(counter)}", "description": "counts zebras on the savanna"}]), args.repeat)
        names = [t["name"] for t in tools]
        delete = best(lambda: engine.writer.delete_tool("big", names.pop()), args.repeat)
        current = engine.snapshots.snapshot("big")
        changed = [*current.tools[:-1], *parse_tools([{"name": "bench_extra", "description": "added"}], ToolLimits())]

        def build(previous):
            return build_snapshot("big", current.version + 1, changed, embedder, engine.writer.store,
                                  hnsw_min_tools=settings.hnsw_min_tools, previous=previous)

        derived_s = best(lambda: build(current), args.repeat)
        rebuilt_s = best(lambda: build(None), 1)
    print(f"| one-tool write, N = {args.tools:,} | seconds |\n|---|---|")
    print(f"| upsert (engine, end to end) | {upsert:.3f} |\n| delete (engine, end to end) | {delete:.3f} |")
    print(f"| snapshot build derived from the previous version | {derived_s:.3f} |")
    print(f"| snapshot build from scratch | {rebuilt_s:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["local", "redis", "upload", "hnsw", "local-child"])
    ap.add_argument("--tools", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--baseline", help="git revision measured in the same run (before/after)")
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--writes", type=int, default=25, help="upserts per writer (redis)")
    ap.add_argument("--desc-chars", type=int, default=2400, help="description length (upload)")
    ap.add_argument("--patience", type=float, default=60, help="client timeout in s (upload)")
    ap.add_argument("--max-wait", type=float, default=3600, help="stop polling an upload job after (upload)")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--vectors", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    defaults = {"local": 4000, "local-child": 4000, "redis": 4000, "upload": 5000, "hnsw": 100_000}
    args.tools = args.tools or defaults[args.mode]
    if args.mode == "local-child":
        print(json.dumps(local_child(args.root, args.tools, args.repeat, args.vectors)))
        return
    {"local": run_local, "redis": run_redis, "upload": run_upload, "hnsw": run_hnsw}[args.mode](args)


if __name__ == "__main__":
    main()
