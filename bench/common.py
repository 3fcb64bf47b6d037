"""What more than one benchmark needs, so that no script imports another (tests/test_architecture.py).

A real `shortlist serve` on a free loopback port (and a Redis, a baseline worktree), the dev sets
as raw JSON, the agent model the learning benchmarks replay, the registries and queries of the
serving benchmarks, a disk cache of embeddings, and the sources, folds and list scoring the
shortlist studies share.
"""

from __future__ import annotations

import contextlib
import hashlib
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
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_EMBEDDER_CACHE = ROOT / "data" / "cache" / "embedder"
#: the dev sets (read-only); SHORTLIST_SHARED_DATA points elsewhere (a worktree's checkout)
SHARED_DATA = Path(os.environ.get("SHORTLIST_SHARED_DATA", ROOT.parent / "shared" / "data"))
#: the sources whose gold is in call order (under SHARED_DATA / "train"), and the MCP tasks
#: under bench/data: what bench/chains.py and bench/companions.py measure
ORDERED_SOURCES = ("nestful", "nestools", "api_bank", "tooltalk", "star")
MCP_TASK_SOURCES = ("mcp_servers", "mcp_servers_new_tasks")
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


def reported_uses(
    rng: random.Random, gold: Sequence[str], shown: Sequence[str], tools: Sequence[str], *, attack: bool
) -> list[str] | None:
    """What a simulated caller reports: :func:`poisoned_uses` for an attacker, else
    :func:`agent_uses` (None: an honest agent that reports nothing)."""
    return poisoned_uses(rng, gold, shown, tools) if attack else agent_uses(rng, gold, shown)


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
        server = Server(embedder_cache, data_dir or Path(tmp), log_path=None, root=root, **settings)
        try:
            server.wait_ready()
            yield RunningServer(url=server.url, pid=server.pid)
        finally:
            server.stop()


# -- registries and queries of the serving benchmarks (perf, soak, upsert) --------------------------

VERBS = ["get", "list", "create", "update", "delete", "search", "find", "fetch", "compute", "convert", "send", "schedule", "cancel", "export", "import", "validate", "summarize", "translate", "track", "book"]
NOUNS = ["invoice", "order", "customer", "ticket", "flight", "hotel", "payment", "report", "user", "account", "shipment", "forecast", "quote", "document", "image", "video", "playlist", "contract", "lead", "campaign", "recipe"]
DOMAINS = ["acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka", "tyrell", "cyberdyne", "soylent", "vandelay"]
QUALIFIERS = ["status", "history", "details", "summary", "metrics", "balance", "schedule", "owner", "tags", "comments"]


def synthetic_tools(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    tools = []
    for i in range(n):
        verb, noun, domain, qual = rng.choice(VERBS), rng.choice(NOUNS), rng.choice(DOMAINS), rng.choice(QUALIFIERS)
        tools.append({
            "name": f"{verb}_{noun}_{qual}_{domain}_{i}",
            "description": f"{verb.capitalize()} the {qual} of a {noun} in the {domain.capitalize()} system. "
                           f"Returns the {noun} {qual} as JSON.",
            "parameters": {"type": "object", "properties": {
                f"{noun}_id": {"type": "string", "description": f"Identifier of the {noun}."},
                "limit": {"type": "integer", "description": "Maximum number of results."}}},
        })
    return tools


def real_tools(data_root: Path) -> list[dict]:
    seen, tools = set(), []
    for name in ("toolbench_stable", "bfcl_simple", "metatool"):
        for tool in json.loads((data_root / name / "tools.json").read_text()):
            if tool["name"] not in seen:
                seen.add(tool["name"])
                tools.append(tool)
    return tools


def real_queries(data_root: Path, limit: int = 500) -> list[str]:
    queries = []
    for name in ("bfcl_simple", "toolbench_stable", "metatool"):
        with open(data_root / name / "queries.jsonl") as handle:
            queries += [json.loads(line)["query"] for line in handle][:limit // 3 + 1]
    random.Random(0).shuffle(queries)
    return queries[:limit]


# -- embeddings cached on disk (the corpus studies) ---------------------------------------------
#
# A disk cache of text embeddings for benchmarks: each text is embedded once across runs.
#
# Benchmarks over the training corpus embed the same ~11,000 tool texts and ~7,000 requests in
# the score tables, the carving sources and the in-process engines; on two shared cores each
# pass costs minutes. :class:`DiskCachedEmbedder` wraps the real embedder (same ``model_id``, so
# score-table keys do not change) and answers a text it has seen from ``<dir>/<model>.npz``.
# ``embed_documents`` and ``embed_query`` agree up to float rounding (``OnnxEmbedder``), so one
# cache serves both.

_SAVE_EVERY = 256  # new query vectors between saves


def disk_cached(inner: Any, directory: Path | None) -> Any:
    """``inner`` behind a :class:`DiskCachedEmbedder` in ``directory`` (None: ``inner`` as is)."""
    return inner if directory is None else DiskCachedEmbedder(inner, directory)


class DiskCachedEmbedder:
    """``embed_query`` / ``embed_documents`` of ``inner``, memoised on disk."""

    def __init__(self, inner: Any, directory: Path) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        tag = hashlib.sha256(self.model_id.encode()).hexdigest()[:12]
        self.path = Path(directory) / f"embeddings-{tag}.npz"
        self._vectors: dict[str, np.ndarray] = {}
        self._unsaved = 0
        if self.path.is_file():
            with np.load(self.path, allow_pickle=False) as z:
                self._vectors = dict(zip(z["keys"].tolist(), z["vectors"]))

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]

    def embed_query(self, text: str) -> np.ndarray:
        key = self._key(text)
        hit = self._vectors.get(key)
        if hit is None:
            hit = np.asarray(self.inner.embed_query(text), dtype=np.float32)
            self._vectors[key] = hit
            self._unsaved += 1
            if self._unsaved >= _SAVE_EVERY:
                self.save()
        return hit

    def embed_documents(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        keys = [self._key(t) for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self._vectors))
        if missing:
            by_key = dict(zip(keys, texts))
            vecs = np.asarray(self.inner.embed_documents([by_key[k] for k in missing], batch_size=batch_size))
            self._vectors.update(zip(missing, vecs.astype(np.float32)))
            self._unsaved += len(missing)
            self.save()
        if not keys:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._vectors[k] for k in keys])

    def save(self) -> None:
        if not self._unsaved:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():  # another process may have added texts meanwhile: keep them
            with np.load(self.path, allow_pickle=False) as z:
                for key, vector in zip(z["keys"].tolist(), z["vectors"]):
                    self._vectors.setdefault(key, vector)
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp.npz")
        keys = list(self._vectors)
        np.savez(tmp, keys=np.array(keys, dtype=np.str_), vectors=np.stack([self._vectors[k] for k in keys]))
        tmp.replace(self.path)
        self._unsaved = 0


# -- the sources and list scoring of the shortlist studies (peers, studies/, scripts/) ---------------

# Misses a user sees at once on real registries (the harvested tools/list files and the demo
# registry): (registry file under ROOT, request, the tool it needs).
NAMED_MISSES: tuple[tuple[str, str, str], ...] = (
    ("bench/data/mcp_registries/memory.json", "remember that Alice works at Acme", "create_entities"),
    ("examples/demo_tools.json", "what will the weather be in Paris tomorrow", "get_weather_forecast"),
    ("bench/data/mcp_registries/github.json", "open a PR from feature-x into main", "create_pull_request"),
    ("bench/data/mcp_registries/github.json", "create a PR", "create_pull_request"),
    ("bench/data/mcp_registries/filesystem.json", "save this summary as notes.md", "write_file"),
)
DEV_SETS = ("bfcl_simple", "metatool", "toolbench_stable")
MULTI_SHARE = 0.15  # a source with at least this share of multi-tool queries is "multi-tool"
DEEP_K = 20
SCORER_NAMES = ("bm25", "dense", "hybrid")
Slot = tuple[str, tuple[str, ...]]  # a shown tool and the near-duplicates folded into it


def source_dirs() -> list[Path]:
    """The ten sets of ``<shared>/train`` and the three dev sets (a worktree falls back to
    /work/shared/data when its parent holds no shared/)."""
    shared = SHARED_DATA if SHARED_DATA.is_dir() else Path("/work/shared/data")
    train = sorted(p for p in (shared / "train").iterdir() if (p / "tools.json").is_file())
    return train + [shared / name for name in DEV_SETS]


def efficiency(curve: np.ndarray, found: float, mean_k: float) -> float:
    """K_eq / mean K: the fixed depth with the same found rate over the policy's mean depth."""
    if found <= curve[1]:
        k_eq = found / curve[1] if curve[1] > 0 else 0.0
    elif found > curve[-1]:
        return float("inf")
    else:
        j = int(np.searchsorted(curve, found))
        lo, hi = curve[j - 1], curve[j]
        k_eq = j - 1 + ((found - lo) / (hi - lo) if hi > lo else 1.0)
    return k_eq / mean_k if mean_k > 0 else float("nan")


def policy_engine(
    tools: Any, registry: str, tmp: Path, embedder: Any, policy_dir: Path, coverage: Path | None = None
) -> Any:
    """An engine built as the service builds it, serving ``tools`` as ``registry`` from ``tmp``
    with the depth policy of ``policy_dir`` (and a coverage model when given). Exploration is off:
    the service serves 5% of adaptive lists 1-3 tools deeper at random (the learning loop's
    propensities), and a benchmark comparing two configurations must not draw that noise."""
    from registry.assembly import Registries
    from registry.serving.depth_policies import OnnxDepthPolicy
    from registry.settings import Settings
    from registry.store.local import LocalStore

    tmp.mkdir(parents=True, exist_ok=True)
    settings = Settings(data_dir=tmp, demo_registry=None, policy_dir=policy_dir, coverage_model=coverage,
                        explore_share=0.0)  # fmt: skip
    engine = Registries.build(settings, LocalStore(tmp), embedder, OnnxDepthPolicy.from_dir(policy_dir))
    engine.writer.put_registry(registry, tools)
    return engine


def answer_slots(answer: Any) -> list[Slot]:
    """A shortlist's slots: each shown tool with the near-duplicates folded into it."""
    return [(t.name, tuple(t.alternates)) for t in answer.tools]


def score_slots(slots: Sequence[Slot], gold: set[str], tokens: dict[str, float]) -> dict[str, float]:
    """One list's figures. A needed tool counts as found when it is shown or folded into a shown
    slot as an alternate (the response names it, and the agent can call it); K counts slots, and
    tokens count each shown definition plus the alternates' names, which is what the list costs."""
    offered = {name for name, _ in slots} | {a for _, alts in slots for a in alts}
    hits = len(gold & offered)
    return {
        "any": float(hits > 0),
        "recall": hits / len(gold),
        "all": float(hits == len(gold)),
        "k": float(len(slots)),
        "tokens": float(sum(tokens.get(n, 0.0) + sum(len(a) + 3 for a in alts) / 4 for n, alts in slots)),
    }


def ranker_for(source: str, embedder: Any, fold_embedders: Path | None, embedding_cache: Path | None) -> Any:
    """The embedder that ranks ``source``: with ``fold_embedders``, the fold fine-tune that held
    it out (behind the embedding cache), else ``embedder``; a missing fold ends the run."""
    if fold_embedders is None:
        return embedder
    from registry.offline.finetune_loso import held_out_embedder

    try:
        return disk_cached(held_out_embedder(fold_embedders, source), embedding_cache)
    except FileNotFoundError as exc:
        raise SystemExit(str(exc)) from exc


def trained_queries(manifest: Path, source: str, queries: Sequence[Any]) -> set[int]:
    """Positions of ``queries`` (``source``'s, in file order) that the fine-tune of ``manifest``
    trained on: its ``subsample`` drawn again (:func:`registry.offline.corpus.subsample`)."""
    from registry.offline.corpus import subsample

    meta = json.loads(manifest.read_text(encoding="utf-8"))
    if source not in meta.get("datasets", {}):
        return set()
    draw = meta["subsample"]
    return set(subsample(range(len(queries)), draw["max_queries"], draw["seed"]))


# -- the leave-one-dataset-out folds (studies/leave_one_out.py, studies/bias_curve.py) -------------

DEV = {
    "bfcl": SHARED_DATA / "bfcl_simple",
    "meta": SHARED_DATA / "metatool",  # --max-queries 2000 samples it (BFCL and ToolBench are smaller)
    "tool": SHARED_DATA / "toolbench_stable",
}
# (training sets, left-out set); "live" is BFCL live (data/bfcl_live, bench/studies/convert_bfcl_live.py)
FOLDS = [(["meta", "tool"], "bfcl"), (["bfcl", "tool"], "meta"), (["bfcl", "meta"], "tool"),
         (["bfcl", "meta", "tool"], "live")]
