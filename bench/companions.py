"""Companions learned from feedback: does feedback on half of a source's tasks, then a refit,
raise the other half's coverage, and what does it cost in list length?

    nice -n 10 python bench/companions.py --max-queries 200 --json bench/out/companions.json

Per source (the ordered sources of ``bench/chains.py``, plus ``--dirs`` such as single-tool
sources), through the in-process core as the service builds it (``registry.core.Shortlister``:
real MiniLM, the shipped policy, exploration off): the tasks are shuffled (seed 1) and halved.
The held-out half is measured first (*before*); then every task of the other half is asked and
its feedback sent, as an agent would (``used`` and ``calls``, the gold tools in call order,
from ``--callers`` agents taking turns), and the registry refitted
(``POST /registries/{r}/policies/refit``: the learned companions ship there, with the usage
memory's fits). The held-out half is measured again with the shipped companions (*after*) and
with them withdrawn (*no companions*: the usage memory's lift alone), so the companions' own
effect is *after - no companions*. Measured: recall, all-needed (every gold tool shown),
mean K, and step-wise (with ``called`` = gold 1..i-1, is gold i shown?) with its mean K.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import DEFAULT_EMBEDDER_CACHE, MCP_TASK_SOURCES, ORDERED_SOURCES, SHARED_DATA  # noqa: E402
from registry.feedback import FeedbackRequest  # noqa: E402
from registry.request import ShortlistRequest  # noqa: E402

REGISTRY = "companions"


def _shown(answer: Any) -> set[str]:
    return {n for t in answer.tools for n in (t.name, *t.alternates)}


def _label(budget: tuple[float, int, int]) -> str:
    return ":".join(map(str, budget))


def _set_budget(budget: tuple[float, int, int]) -> None:
    """The composition's companion budget (a study knob: module constants of chains)."""
    from registry.serving import chains

    chains.APPEND_SHARE, chains.COMPANION_ANCHORS, chains.MAX_COMPANIONS = budget


def measure(core: Any, queries: list[Any]) -> dict[str, float]:
    """Whole-list recall / all-needed / mean K, and step-wise next-tool-shown with ``called``."""
    whole: list[tuple[float, float, float]] = []
    steps: list[tuple[float, float]] = []
    companions = 0
    for q in queries:
        gold = list(dict.fromkeys(q.gold))
        answer = core.shortlist(ShortlistRequest(REGISTRY, q.query))
        companions += sum(1 for t in answer.tools if t.reason and "learned companion" in t.reason)
        hits = len(_shown(answer) & set(gold))
        whole.append((hits / len(gold), float(hits == len(gold)), float(len(answer.tools))))
        for i in range(1, len(gold)):
            step = core.shortlist(ShortlistRequest(REGISTRY, q.query, called=tuple(gold[:i])))
            steps.append((float(gold[i] in _shown(step)), float(len(step.tools))))
    out = {"recall": float(np.mean([w[0] for w in whole])), "all": float(np.mean([w[1] for w in whole])),
           "k": float(np.mean([w[2] for w in whole])), "companions_per_list": companions / len(whole)}
    if steps:
        out |= {"steps": len(steps), "step": float(np.mean([s[0] for s in steps])),
                "step_k": float(np.mean([s[1] for s in steps]))}
    return out


def run_source(directory: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    from registry.core import Shortlister
    from registry.errors import ValidationFailed
    from registry.offline.datasets import load_dataset
    from registry.settings import Settings

    tools = json.loads((directory / "tools.json").read_text(encoding="utf-8"))
    queries = [q for q in load_dataset(directory).queries if q.gold]
    if len(queries) > args.max_queries:
        queries = random.Random(0).sample(queries, args.max_queries)
    random.Random(1).shuffle(queries)
    learn, held = queries[: len(queries) // 2], queries[len(queries) // 2 :]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="companions-") as tmp:
        settings = Settings(data_dir=Path(tmp), embedder_cache_dir=args.embedder_cache, demo_registry=None,
                            query_cache_size=100_000, explore_share=0.0, learning_save_interval_seconds=3600.0,
                            max_tools_per_registry=50_000)  # fmt: skip
        core = Shortlister.from_settings(settings, start=True)
        try:
            core.put_registry(REGISTRY, tools)
            if args.min_share is not None or args.min_uses is not None:  # a study of the bars
                from dataclasses import replace

                bars = core.learning.companion_config
                core.learning.companion_config = replace(
                    bars, min_share=args.min_share if args.min_share is not None else bars.min_share,
                    min_uses=args.min_uses if args.min_uses is not None else bars.min_uses)
            held = [q for q in held if len(q.query) <= settings.max_query_chars]
            before = measure(core, held)
            sent = 0
            for i, q in enumerate(learn):
                caller = f"agent-{i % args.callers}"
                try:
                    answer = core.shortlist(ShortlistRequest(REGISTRY, q.query), caller=caller)
                except ValidationFailed:
                    continue
                gold = list(dict.fromkeys(q.gold))
                calls = [{"tool": t, "useful": True} for t in gold]
                core.feedback(FeedbackRequest(answer.shortlist_id, gold, calls, True), caller=caller)
                sent += 1
            job = core.policies.refit(REGISTRY)
            fit = (job.estimate.get("profile") or {}).get("companions", {})
            after = {}
            for budget in args.budgets:
                _set_budget(budget)
                after[_label(budget)] = measure(core, held)
            _set_budget(args.budgets[0])
            shipped = core.graph(REGISTRY)["learned"]
            core.learning.set_companions(REGISTRY, [], {"withdrawn": "bench"})
            plain = measure(core, held)
        finally:
            core.close()
    return {"source": directory.name, "n_tools": len(tools), "learned_from": sent, "held_out": len(held),
            "edges": len(shipped), "fit": fit, "before": before, "after": after[_label(args.budgets[0])],
            "budgets": after, "no_companions": plain,
            "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-queries", type=int, default=200, help="tasks sampled per source (seed 0), halved")
    ap.add_argument("--callers", type=int, default=20, help="agents sending the feedback, taking turns")
    ap.add_argument("--sources", nargs="*", default=None, help="source names (default: all ordered ones)")
    ap.add_argument("--dirs", type=Path, nargs="*", default=[], help="more data dirs (e.g. single-tool sources)")
    ap.add_argument("--embedder-cache", type=Path, default=DEFAULT_EMBEDDER_CACHE)
    ap.add_argument("--data", type=Path, default=SHARED_DATA / "train", help="where the ordered sources are")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--min-share", type=float, default=None, help="study: CompanionConfig.min_share")
    ap.add_argument("--min-uses", type=float, default=None, help="study: CompanionConfig.min_uses")
    ap.add_argument("--budgets", default=None,
                    help="study: APPEND_SHARE:COMPANION_ANCHORS:MAX_COMPANIONS,... each measured after the "
                         "same refit (the first is the one reported; default: the shipped budget)")
    args = ap.parse_args()
    from registry.serving import chains

    shipped = (chains.APPEND_SHARE, chains.COMPANION_ANCHORS, chains.MAX_COMPANIONS)
    args.budgets = [shipped] if not args.budgets else [
        (float(a), int(b), int(c)) for a, b, c in (part.split(":") for part in args.budgets.split(","))
    ]
    print(f"budgets (share:anchors:max): {', '.join(map(_label, args.budgets))}; {args.callers} callers", flush=True)
    dirs = [args.data / s for s in ORDERED_SOURCES] + [ROOT / "bench" / "data" / s for s in MCP_TASK_SOURCES]
    dirs = [d for d in dirs if (d / "queries.jsonl").is_file() and (args.sources is None or d.name in args.sources)]
    dirs += args.dirs
    rows = []
    print(f"{'source':24} {'edges':>5}  recall b/a/nc        all-needed b/a/nc     mean K b/a/nc      "
          f"step b/a/nc           step K b/a   comp/list")
    for directory in dirs:
        r = run_source(directory, args)
        if r is None:
            continue
        rows.append(r)
        b, a, n = r["before"], r["after"], r["no_companions"]
        print(f"{r['source']:24} {r['edges']:5d}  {b['recall']:.3f}/{a['recall']:.3f}/{n['recall']:.3f}  "
              f"{b['all']:.3f}/{a['all']:.3f}/{n['all']:.3f}  {b['k']:.2f}/{a['k']:.2f}/{n['k']:.2f}  "
              f"{b.get('step', 0):.3f}/{a.get('step', 0):.3f}/{n.get('step', 0):.3f}  "
              f"{b.get('step_k', 0):.2f}/{a.get('step_k', 0):.2f}  {a['companions_per_list']:.2f}"
              f"  ({r['seconds']}s)", flush=True)
        for label, a in list(r["budgets"].items())[1:]:
            print(f"  budget {label}: recall {a['recall']:.3f}, all-needed {a['all']:.3f}, mean K {a['k']:.2f}, "
                  f"step {a.get('step', 0):.3f} @{a.get('step_k', 0):.2f}, {a['companions_per_list']:.2f}/list")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
