"""/metrics size and scrape time at many registries (issue 23 item 9), before and after the bound.

    python bench/metrics_size.py [--registries 10000] [--served 0.1] [--baseline d95db62]

Each row runs in its own process against one checkout (the baseline revision in a temporary git
worktree, then this one with the default SHORTLIST_METRICS_MAX_REGISTRIES and with the bound
lifted): the service's own metric objects (``service.metrics.Metrics``,
``service.feedback_metrics.FeedbackMetrics`` and the core's live window) get what a replica's
listeners give them when it loads ``--registries`` registries (size and version, series at
zero), then one shortlist and one feedback event for a ``--served`` share of them. It prints the
bytes ``GET /metrics`` returns (``generate_latest``, what the route sends) and the median of 3
renderings: the scrape's server-side cost, HTTP aside.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASELINE = "d95db62"  # main just before the bound


def measure(registries: int, served: float, max_registries: int | None) -> dict[str, float]:
    """In this process (whatever checkout PYTHONPATH names): build, fill, render."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from registry.feedback import FeedbackEvent, LiveWindow
    from registry.serving.result import Shortlist, ShortlistItem
    from service.feedback_metrics import FeedbackMetrics
    from service.metrics import Metrics

    metrics_class: Any = Metrics  # the baseline's takes no bound
    bounded = "max_registries" in inspect.signature(Metrics).parameters
    if bounded:
        from service.settings import ServiceSettings

        metrics = metrics_class(max_registries if max_registries is not None
                                else ServiceSettings().metrics_max_registries)
    else:
        metrics = metrics_class()
    window = LiveWindow(window_seconds=3600.0)
    extra = (metrics.registry_labels,) if bounded else ()
    feedback = FeedbackMetrics(metrics.registry, window, *extra)
    every = max(1, round(1 / served)) if served > 0 else 0
    now = time.time()
    for i in range(registries):
        name = f"registry-{i:05d}"
        metrics.set_registry(name, 1, 20)  # what ServiceState._registry_changed does on a load
        feedback.touch(name)
        if every and i % every == 0:
            item = ShortlistItem(name="tool_0", rank=1, score=0.9, definition={})
            result = Shortlist(
                shortlist_id=f"s{i}", registry=name, version=1, policy="bor", scorer="hybrid", k=3,
                n_tools=20, p_rand=0.15, bor_max_bits=2.7, tools=[item],
                timings={"embed": 0.006, "search": 0.001, "policy": 0.0005, "total": 0.008},
                policy_version="default",
            )
            metrics.observe_shortlist(result)
            event = FeedbackEvent(
                shortlist_id=f"s{i}", registry=name, version=1, n_tools=20, k=3,
                shown=("tool_0", "tool_1", "tool_2"), used=("tool_0",), success=True, calls=(),
                presented_exact=True, presented_equivalent=True, p_rand_exact=0.15,
                p_rand_equivalent=0.15, received=now,
            )
            window.add(event)
            feedback.observe(event)
    seconds = []
    for _ in range(3):
        t0 = time.perf_counter()
        body = generate_latest(metrics.registry)
        seconds.append(time.perf_counter() - t0)
    labels = {
        s.labels["registry"]
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples if "registry" in s.labels
    }
    return {"bytes": len(body), "seconds": statistics.median(seconds), "registry_labels": len(labels)}


def run_child(root: Path, args: argparse.Namespace, max_registries: int | None) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=f"{root}:{root / 'client' / 'src'}")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure",
           "--registries", str(args.registries), "--served", str(args.served)]
    if max_registries is not None:
        cmd += ["--max-registries", str(max_registries)]
    out = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--registries", type=int, default=10_000)
    parser.add_argument("--served", type=float, default=0.1,
                        help="share of registries with one shortlist and one feedback event")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="revision measured as 'before'")
    parser.add_argument("--max-registries", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.registries, args.served, args.max_registries)))
        return
    sys.path.insert(0, str(ROOT / "bench"))
    from common import worktree

    rows: list[tuple[str, dict[str, float]]] = []
    with worktree(args.baseline) as base:
        rows.append((f"before ({args.baseline})", run_child(base, args, None)))
    rows.append(("after, default bound (100)", run_child(ROOT, args, None)))
    rows.append(("after, bound lifted", run_child(ROOT, args, args.registries)))
    print(f"/metrics at {args.registries:,} registries ({args.served:.0%} served once)")
    print(f"{'checkout':<30} {'bytes':>12} {'scrape s':>9} {'registry labels':>16}")
    for name, r in rows:
        print(f"{name:<30} {r['bytes']:>12,} {r['seconds']:>9.3f} {r['registry_labels']:>16,}")


if __name__ == "__main__":
    main()
