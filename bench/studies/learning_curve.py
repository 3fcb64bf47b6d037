"""The learning loop end to end (issue 11 Goals): found@1, found, mean K and efficiency after
0 / 1k / 5k (/ 20k) feedback events, for no learning, usage ranking only, refit only, both,
and a poisoning run.

Each dev set's queries are split 50/50 by a fixed seed. An agent stream draws queries from
the first half against the in-process core (``registry.core.Shortlister``: real MiniLM, the
default bor policy; a real server is too slow for ~100k requests on 2 shared cores) and
reports feedback with the issue's agent model: it uses the gold tool(s) when shown; when not,
with probability 0.5 it found them elsewhere and reports them on the shortlist that missed
them, else it sends nothing; 10% of events are noise (a random shown tool). Ten honest callers
take turns. The held-out half is evaluated at each checkpoint (exploration off: the policy's
own depth).

Configurations, each its own registry (same tools) in one core, state never shared:

    none     learning off, no exploration, never refit (the baseline; feedback changes nothing
             for it, so its stream is skipped and each checkpoint re-evaluated)
    usage    usage memory on (registry/learning/usage.py), no exploration, never refit
    refit    learning off, exploration SHORTLIST_EXPLORE_SHARE, refit every --refit-every events
    both     usage memory on, exploration, refits
    poison   like both, plus one caller sending 30% of the events, each naming the
             best-ranked shown tool that is not gold
    poison_refit  like refit (no usage memory), with the same poisoner

Efficiency is ``K_eq / mean K`` with ``K_eq`` read on the fixed top-K curve of the baseline
ranking (no learning) over the same held-out queries: what plain top-K would need for the same
found rate. The exploration cost is measured on the stream: mean (shown K - chosen K).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/studies/learning_curve.py [--datasets bfcl_simple ...]
        [--events 1000,5000] [--eval 400] [--out bench/out/learning_curve.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np

from registry.feedback import FeedbackRequest
from registry.request import ShortlistRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import DEFAULT_EMBEDDER_CACHE, raw_dataset, reported_uses
from registry.core import Shortlister
from registry.offline.metrics import k_equivalent
from registry.serving.explore import Explorer
from registry.settings import Settings

SEED = 11
HONEST = [f"agent-{i}" for i in range(10)]
CONFIGS = ("none", "usage", "refit", "both")
FIXED_DEPTH = 50


def make_core(data_dir: Path, explore: float) -> Shortlister:
    settings = Settings(
        data_dir=data_dir,
        embedder_cache_dir=DEFAULT_EMBEDDER_CACHE,
        demo_registry=None,
        query_cache_size=100_000,
        explore_share=explore,
        learning_save_interval_seconds=3600.0,
        max_tools_per_registry=50_000,
    )
    return Shortlister.from_settings(settings, start=True)


def fixed_curve(core: Shortlister, registry: str, held: list[dict[str, Any]]) -> np.ndarray:
    """Found rate of fixed top-K, K = 0..FIXED_DEPTH, on the registry's current ranking."""
    hits = np.zeros(FIXED_DEPTH + 1)
    for q in held:
        names = [t.name for t in core.shortlist(ShortlistRequest(registry, q["query"], k=FIXED_DEPTH)).tools]
        rank = next((i for i, n in enumerate(names) if n in set(q["gold"])), None)
        if rank is not None:
            hits[rank + 1 :] += 1
    return hits / max(len(held), 1)


def evaluate(
    core: Shortlister, registry: str, held: list[dict[str, Any]], curve: np.ndarray,
    seen_tools: set[str] | None = None,
) -> dict[str, Any]:
    """Held-out metrics, overall and split into *seen tool, new phrasing* (a gold tool of the
    request received feedback in the stream) and *unseen tool*."""
    queries = core.queries if isinstance(core, Shortlister) else None
    explorer = queries.explorer if queries is not None else None
    if queries is not None:
        queries.explorer = Explorer(0.0)
    seen_tools = seen_tools or set()
    split: dict[str, list[int]] = {"seen": [0, 0, 0], "unseen": [0, 0, 0]}  # n, at1, found
    try:
        at1 = found = depth = 0
        versions: set[str] = set()
        for q in held:
            result = core.shortlist(ShortlistRequest(registry, q["query"]))
            names = [t.name for t in result.tools]
            gold = set(q["gold"])
            hit1 = bool(names) and names[0] in gold
            hit = not gold.isdisjoint(names)
            at1 += hit1
            found += hit
            depth += len(names)
            versions.add(result.policy_version)
            part = split["seen" if gold & seen_tools else "unseen"]
            part[0] += 1
            part[1] += hit1
            part[2] += hit
    finally:
        if queries is not None:
            queries.explorer = explorer
    n = max(len(held), 1)
    mean_k = depth / n
    eff = k_equivalent(curve, found / n) / mean_k if mean_k else float("nan")
    return {
        "found@1": round(100 * at1 / n, 2),
        "found": round(100 * found / n, 2),
        "mean_k": round(mean_k, 3),
        "efficiency": round(eff, 3),
        "policy_version": sorted(versions),
        **{f"{kind}_{field}": (round(100 * part[i] / part[0], 2) if part[0] else None)
           for kind, part in split.items() for i, field in ((1, "found@1"), (2, "found"))},
        "seen_n": split["seen"][0],
        "unseen_n": split["unseen"][0],
        "profile_weight": profile_weight(core, registry),
        "similarity": memory_similarity(core, registry),
    }


def profile_weight(core: Any, registry: str) -> float:
    """The registry's fitted usage-profile weight (in-process or over HTTP)."""
    if hasattr(core, "profile_weight"):
        return float(core.profile_weight(registry))
    return float(core.learning.memory.weight(registry))


def memory_similarity(core: Any, registry: str) -> float | None:
    """The usage memory's neighbourhood for the registry (fitted by a refit, else the setting)."""
    if hasattr(core, "memory_similarity"):
        return core.memory_similarity(registry)  # type: ignore[no-any-return]
    learning = getattr(core, "learning", None)
    return None if learning is None else float(learning.memory.similarity(registry))


def stream(
    core: Shortlister,
    registry: str,
    train: list[dict[str, Any]],
    events: int,
    rng: random.Random,
    extra: list[int],
    attacker_share: float = 0.0,
    seen_tools: set[str] | None = None,
    shared_token: bool = False,
) -> None:
    """Agent episodes until ``events`` feedback events were sent (the issue's agent model);
    ``seen_tools`` collects the tools honest agents reported; with ``shared_token`` every agent,
    the attacker too, is one caller (one query token, no X-Caller-Id)."""
    sent = 0
    memory = core.feedback_recorder.memory if hasattr(core, "feedback_recorder") else None
    names = [t.name for t in core.snapshot(registry).tools]  # the poisoner's fallback picks
    while sent < events:
        q = rng.choice(train)
        attack = rng.random() < attacker_share
        caller = "attacker" if attack else HONEST[sent % len(HONEST)]
        if shared_token:
            caller = "shared-token"
        result = core.shortlist(ShortlistRequest(registry, q["query"]), caller=caller)
        remembered = memory.get(result.shortlist_id) if memory is not None else None
        if remembered is not None:
            extra.append(remembered.k - remembered.depth_chosen)
        shown = [t.name for t in result.tools]
        gold = list(q["gold"])
        reported = reported_uses(rng, gold, shown, names, attack=attack)
        if reported is None:
            continue
        used = reported
        if seen_tools is not None and not attack:  # what honest agents reported
            seen_tools.update(used)
        core.feedback(FeedbackRequest(result.shortlist_id, used, success=True), caller=caller)
        sent += 1


def run_config(
    core: Shortlister,
    config: str,
    tools: list[dict[str, Any]],
    train: list[dict[str, Any]],
    held: list[dict[str, Any]],
    curve: np.ndarray,
    checkpoints: list[int],
    refit_every: int,
    explore: float,
    seen_ref: dict[int, set[str]],
    stream_seed: int = 0,
) -> dict[str, Any]:
    registry = config
    core.put_registry(registry, tools)
    learning = config in ("usage", "both", "poison", "poison_shared")
    refits = config in ("refit", "both", "poison", "poison_refit", "poison_shared")
    core.set_learning(registry, learning)
    core.wipe_learning(registry)
    if isinstance(core, Shortlister):  # over HTTP the server's share applies to every config
        core.queries.explorer = Explorer(explore if refits else 0.0)
    rng = random.Random(SEED + 1 + stream_seed)
    attacker = 0.3 if config.startswith("poison") else 0.0
    rows: list[dict[str, Any]] = []
    refit_log: list[dict[str, Any]] = []
    extra: list[int] = []
    seen_tools: set[str] = set()
    done = 0
    started = time.time()
    for target in [0, *checkpoints]:
        while done < target and config == "none":  # feedback changes nothing here: skip it,
            stream(core, registry, train, target - done, rng, extra, 0.0, seen_tools)  # but
            done = target  # its draws say which held-out requests' tools are "seen"
        while done < target:
            step = min(refit_every, target - done) if refits else target - done
            stream(core, registry, train, step, rng, extra, attacker, seen_tools,
                   shared_token=config == "poison_shared")
            done += step
            if refits and done % refit_every == 0:
                job = core.policies.refit(registry)
                refit_log.append({"events": done, "state": job.state, "reason": job.reason,
                                  "version": job.version, "active": job.active,
                                  "estimate": job.estimate})
                print(f"  [{config}] refit at {done}: {job.state} ({job.reason})", flush=True)
        if config == "none":  # one split for every configuration: what none's stream reported
            seen_ref[target] = set(seen_tools)
        row = {"events": target, **evaluate(core, registry, held, curve, seen_ref.get(target, seen_tools))}
        rows.append(row)
        print(f"  [{config}] {json.dumps(row)} ({time.time() - started:.0f}s)", flush=True)
    cost = float(np.mean(extra)) if extra else 0.0
    return {"config": config, "curve": rows, "refits": refit_log,
            "explore_extra_k": round(cost, 4), "stream_shortlists": len(extra)}


def run_dataset(
    name: str, checkpoints: list[int], n_eval: int, base: Path, refit_every: int, explore: float,
    configs: list[str], stream_seed: int = 0, http: bool = False,
) -> dict[str, Any]:
    tools, queries = raw_dataset(name)
    rng = random.Random(SEED)
    order = list(range(len(queries)))
    rng.shuffle(order)
    half = len(order) // 2
    train = [queries[i] for i in order[:half]]
    held = [queries[i] for i in order[half:]][:n_eval]
    server = None
    if http:  # a real server process; every call goes through the public routes
        from bench.common import Server

        server = Server(DEFAULT_EMBEDDER_CACHE, base / f"{name}-http", explore_share=str(explore),
                        query_cache_size="100000", learning_save_interval_seconds="3600",
                        max_tools_per_registry="50000", log_path=base / f"{name}-http.log")
        server.wait_ready()
        core: Any = HttpCore(server.url)
    else:
        core = make_core(base / name, explore)
    # refits read the core's own feedback log (incrementally), replaying each logged request on
    # the ranking the registry serves at the refit (usage memory and the new profile weight)
    seen_ref: dict[int, set[str]] = {}  # checkpoint -> tools the no-learning stream reported
    try:
        t0 = time.time()
        core.put_registry("none", tools)
        core.set_learning("none", False)
        curve = fixed_curve(core, "none", held)
        print(f"[{name}] {len(tools)} tools, {len(train)} stream / {len(held)} held-out queries, "
              f"fixed found@1/5/20 {curve[1]:.3f}/{curve[5]:.3f}/{curve[20]:.3f} "
              f"({time.time() - t0:.0f}s)", flush=True)
        results = [
            run_config(core, c, tools, train, held, curve, checkpoints, refit_every, explore, seen_ref, stream_seed)
            for c in configs
        ]
    finally:
        core.close()
        if server is not None:
            server.stop()
    return {"dataset": name, "http": http, "stream_seed": stream_seed, "stream_queries": len(train), "held_out": len(held),
            "fixed_curve": [round(float(v), 4) for v in curve[:21]], "configs": results}


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One results document from several runs: configurations of the same data set are joined
    (a configuration run twice keeps its first run)."""
    datasets: dict[str, dict[str, Any]] = {}
    for run in runs:
        for ds in run["datasets"]:
            known = datasets.setdefault(ds["dataset"], {**ds, "configs": []})
            names = {c["config"] for c in known["configs"]}
            known["configs"] += [c for c in ds["configs"] if c["config"] not in names]
    order = {c: i for i, c in enumerate((*CONFIGS, "poison", "poison_refit"))}
    for ds in datasets.values():
        ds["configs"].sort(key=lambda c: order.get(c["config"], 99))
    return {"datasets": list(datasets.values())}


def render(results: dict[str, Any]) -> str:
    """The Markdown table of docs/results/learning-curve.md from a results file."""
    lines = [
        "| data set | config | events | found@1 | found | mean K | efficiency | policy |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for ds in results["datasets"]:
        for cfg in ds["configs"]:
            for row in cfg["curve"]:
                lines.append(
                    f"| {ds['dataset']} | {cfg['config']} | {row['events']:,} | {row['found@1']:.1f} "
                    f"| {row['found']:.1f} | {row['mean_k']:.2f} | {row['efficiency']:.2f} "
                    f"| {', '.join(row['policy_version'])} |"
                )
    extra = [
        f"{ds['dataset']} {cfg['config']}: +{cfg['explore_extra_k']:.3f}"
        for ds in results["datasets"] for cfg in ds["configs"] if cfg["config"] in ("refit", "both")
    ]
    return "\n".join(lines) + "\n\nExploration cost (mean extra tools per served list): " + "; ".join(extra)


def similarity_cell(row: dict[str, Any], config: str) -> str:
    """The memory's neighbourhood in a table cell ("-" where the memory is off or not recorded)."""
    value = row.get("similarity")
    return "-" if value is None or config in ("none", "refit", "poison_refit") else f"{value:g}"


def render_split(results: dict[str, Any]) -> str:
    """The issue-22 table: held-out requests split into seen tool (new phrasing) / unseen tool,
    with each checkpoint's gain over no learning at the same checkpoint."""
    lines = [
        "| data set | config | events | memory cosine | profile weight | found@1 | seen tool, new phrasing: n, "
        "found@1 / found | unseen tool: n, found@1 / found | found | mean K | efficiency | policy |",
        "|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|---|",
    ]
    for ds in results["datasets"]:
        base = {r["events"]: r for c in ds["configs"] if c["config"] == "none" for r in c["curve"]}
        for cfg in ds["configs"]:
            for row in cfg["curve"]:
                ref = base.get(row["events"], row)
                cells = []
                for kind in ("seen", "unseen"):
                    at1, found = row.get(f"{kind}_found@1"), row.get(f"{kind}_found")
                    if at1 is None:
                        cells.append(f"{row.get(f'{kind}_n', 0)}, -")
                        continue
                    delta = at1 - (ref.get(f"{kind}_found@1") or 0.0)
                    gain = f" ({delta:+.1f})" if cfg["config"] != "none" else ""
                    cells.append(f"{row[f'{kind}_n']}, {at1:.1f}{gain} / {found:.1f}")
                lines.append(
                    f"| {ds['dataset']}{' (HTTP)' if ds.get('http') else ''} | {cfg['config']} | {row['events']:,} "
                    f"| {similarity_cell(row, cfg['config'])} | {row.get('profile_weight', 0):g} | {row['found@1']:.1f} | {cells[0]} | {cells[1]} "
                    f"| {row['found']:.1f} | {row['mean_k']:.2f} | {row['efficiency']:.2f} "
                    f"| {', '.join(row['policy_version'])} |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["bfcl_simple", "metatool", "toolbench_stable"])
    parser.add_argument("--events", default="1000,5000")
    parser.add_argument("--eval", type=int, default=400, help="held-out queries evaluated")
    parser.add_argument("--refit-every", type=int, default=1000)
    parser.add_argument("--explore", type=float, default=0.05)
    parser.add_argument("--configs", default="none,usage,refit,both,poison")
    parser.add_argument("--out", type=Path, default=Path("bench/out/learning_curve.json"))
    parser.add_argument("--base", type=Path, help="data directory to reuse (tool embeddings cached)")
    parser.add_argument("--stream-seed", type=int, default=0,
                        help="another draw of the agent stream (0: the documented one); the split stays")
    parser.add_argument("--http", action="store_true",
                        help="against a real server over HTTP (exploration --explore for every config)")
    parser.add_argument("--render", type=Path, nargs="+",
                        help="print the Markdown table of results files (runs of one data set "
                        "split by --configs are merged)")
    parser.add_argument("--render-split", type=Path, nargs="+",
                        help="print the seen-tool / unseen-tool table of results files")
    args = parser.parse_args()
    if args.render_split:
        print(render_split(merge([json.loads(p.read_text()) for p in args.render_split])))
        return
    if args.render:
        print(render(merge([json.loads(p.read_text()) for p in args.render])))
        return
    checkpoints = [int(x) for x in args.events.split(",")]
    configs = args.configs.split(",")
    results: dict[str, Any] = {"seed": SEED, "explore": args.explore, "refit_every": args.refit_every,
                               "checkpoints": checkpoints, "datasets": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = args.base or Path(tmp)
        for name in args.datasets:
            results["datasets"].append(
                run_dataset(name, checkpoints, args.eval, base, args.refit_every, args.explore, configs,
                            args.stream_seed, args.http)
            )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


# -- --http: the same calls over a real server ------------------------------------------------------
#
# The calls this script makes on the core, over HTTP to a real server
# (``--http``): the same stream, feedback, refits and evaluation through the public routes.
#
# A server has one exploration share for every registry (``SHORTLIST_EXPLORE_SHARE``, set at
# start), so the HTTP run cannot switch exploration off for evaluation or on for refitting
# configurations the way the in-process run does: it runs every configuration at that share
# (``--explore``, 0 by default over HTTP) and says so in its results.

REFIT_TIMEOUT = 1800.0


@dataclass
class _Tool:
    name: str


@dataclass
class _Result:
    shortlist_id: str
    tools: list[_Tool]
    policy_version: str


@dataclass
class HttpCore:
    """What the learning curve calls on ``registry.core.Shortlister``, over HTTP at ``url``."""

    url: str
    client: httpx.Client = field(init=False)
    _tools: dict[str, list[str]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.url, timeout=120.0)
        self.policies = SimpleNamespace(refit=self._refit)

    def _ok(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise RuntimeError(f"{response.request.method} {response.request.url}: {response.status_code} {response.text[:300]}")
        return response.json() if response.content else None

    def put_registry(self, registry: str, tools: list[dict[str, Any]]) -> None:
        response = self.client.put(f"/registries/{registry}", json={"tools": tools})
        self._ok(response)
        if response.status_code == 202:  # a large upload: poll its job until it is final
            while (job := self._ok(self.client.get(response.headers["Location"])))["state"] in ("queued", "running"):
                time.sleep(0.5)
            if job["state"] != "done":
                raise RuntimeError(f"upload of {registry!r}: {job}")
        self._tools[registry] = [str(t.get("name") or t.get("function", {}).get("name")) for t in tools]

    def snapshot(self, registry: str) -> Any:
        return SimpleNamespace(tools=[_Tool(n) for n in self._tools[registry]])

    def set_learning(self, registry: str, enabled: bool) -> None:
        self._ok(self.client.put(f"/registries/{registry}/learning", json={"enabled": enabled}))

    def wipe_learning(self, registry: str) -> None:
        self._ok(self.client.delete(f"/registries/{registry}/learning"))

    def profile_weight(self, registry: str) -> float:
        return float(self._ok(self.client.get(f"/registries/{registry}/learning"))["profile_weight"])

    def memory_similarity(self, registry: str) -> float | None:
        value = self._ok(self.client.get(f"/registries/{registry}/learning")).get("similarity")
        return None if value is None else float(value)

    def shortlist(self, request: ShortlistRequest, caller: str | None = None) -> _Result:
        body: dict[str, Any] = {"registry": request.registry, "query": request.query}
        if request.k is not None:
            body["k"] = request.k
        headers = {"X-Caller-Id": caller} if caller else {}
        data = self._ok(self.client.post("/shortlist", json=body, headers=headers))
        return _Result(data["shortlist_id"], [_Tool(t["name"]) for t in data["tools"]], data["policy_version"])

    def feedback(self, shortlist_id: str, used: list[str], success: bool, caller: str | None = None) -> None:
        headers = {"X-Caller-Id": caller} if caller else {}
        body = {"shortlist_id": shortlist_id, "used": used, "success": success}
        self._ok(self.client.post("/feedback", json=body, headers=headers))

    def _refit(self, registry: str) -> Any:
        response = self.client.post(f"/registries/{registry}/policies/refit", json={}, timeout=REFIT_TIMEOUT)
        job = self._ok(response)
        return SimpleNamespace(**{k: job.get(k) for k in ("state", "reason", "version", "active", "estimate")})

    def close(self) -> None:
        self.client.close()


if __name__ == "__main__":
    main()
