"""What 1 / 10 / 30 attacker feedback events do to found@1 of the right tool on near-paraphrases,
and whether 30 legitimate events then undo them (issue 23 item 2), before and after, in one run.

    nice -n 10 python bench/shared_token.py --baseline cc09328 [--out docs/generated/shared_token.json]

In-process core (real MiniLM), the demo registry. The requests are rewordings of one request, "show me
the apple share price and news": ``get_stock_quote`` is the right tool and ranks first, with
``get_news_headlines`` second 0.04-0.21 below (less than the usage memory's ``beta``, 0.3: the
near-tie a poisoner can flip). The attacker claims ``get_news_headlines`` for 1, 10 or 30 such
requests; then 30 legitimate events claim ``get_stock_quote`` for the same requests. The probe
set is 12 rewordings none of the events used; found@1 is the
share of probes whose first tool (rank 1 of the served list) is ``get_stock_quote``.

Three deployments: open (no tokens, every caller anonymous), one shared query token (every agent
and the attacker one caller) and per-agent tokens (the attacker one token, the legitimate events
from ten others). ``--baseline REV`` runs the same scenario on that revision first (a temporary
git worktree, in a child process with PYTHONPATH pointing there; ``BENCH_BASELINE_PYTHONPATH``
is put first for it, e.g. a directory holding the dependency versions that revision needs).
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EMBEDDER_CACHE = ROOT / "data" / "cache" / "embedder"  # bench.common's, shared by both checkouts

RIGHT, WRONG = "get_stock_quote", "get_news_headlines"
_ASK = ("show me", "please show me", "can you show me", "i want to see", "give me", "pull up",
        "display", "let me see", "get me", "tell me")
_WHEN = ("", " please", " now", " today", " right now")
# 50 rewordings of one request (cosine 0.70-0.99 between them, mean 0.89), in a fixed shuffle
TEXTS = [f"{ask} the apple share price and news{when}" for ask, when in itertools.product(_ASK, _WHEN)]
random.Random(0).shuffle(TEXTS)
PROBES, EVENTS = TEXTS[:12], TEXTS[12:42]
ATTACKS = (1, 10, 30)
LEGITIMATE = 30
DEPLOYMENTS = ("open", "shared token", "per-agent tokens")
TOKEN = "one-shared-token-0123456789"


def run_scenario() -> list[dict[str, Any]]:
    """The scenario on whatever checkout PYTHONPATH names (this one or a baseline's)."""
    from pydantic import SecretStr

    from registry.core import Shortlister
    from service.settings import ServiceSettings

    try:  # a ShortlistRequest value since the request refactor; (registry, query, k=) before
        from registry.request import ShortlistRequest
    except ImportError:
        ShortlistRequest = None  # type: ignore[assignment,misc]
    try:  # a revision before the feedback request value passes the fields loose
        from registry.feedback import FeedbackRequest
    except ImportError:
        FeedbackRequest = None  # type: ignore[assignment,misc]

    def shortlist(core: Shortlister, query: str, caller: str | None, k: int | None = None) -> Any:
        if ShortlistRequest is not None and "request" in inspect.signature(core.shortlist).parameters:
            return core.shortlist(ShortlistRequest("demo", query, k=k), caller=caller)
        old: Any = core  # the baseline's signature
        return old.shortlist("demo", query, k=k, caller=caller)

    def found_at_1(core: Shortlister) -> float:
        # the first tool of the list the policy serves (an explicit k=1 would rank only the
        # first 1 tool: the usage lift reorders within the requested window)
        hits = sum(shortlist(core, q, None).tools[0].name == RIGHT for q in PROBES)
        return round(100 * hits / len(PROBES), 1)

    def send(core: Shortlister, texts: list[str], tool: str, callers: list[str | None]) -> None:
        for i, text in enumerate(texts):
            caller = callers[i % len(callers)]
            result = shortlist(core, text, caller)
            if FeedbackRequest is not None:
                core.feedback(FeedbackRequest(result.shortlist_id, [tool], success=True), caller=caller)
            else:
                old: Any = core  # the baseline's signature
                old.feedback(result.shortlist_id, [tool], success=True, caller=caller)

    tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())
    rows: list[dict[str, Any]] = []
    for deployment in DEPLOYMENTS:
        tokens = () if deployment == "open" else (SecretStr(TOKEN),)
        attacker: list[str | None] = [None] if deployment == "open" else ["caller-attacker"]
        callers: dict[str, list[str | None]] = {
            "open": [None], "shared token": ["caller-attacker"],  # one token: one caller
            "per-agent tokens": [f"caller-agent-{i}" for i in range(10)],
        }
        honest = callers[deployment]
        for attack in ATTACKS:
            with tempfile.TemporaryDirectory() as tmp:
                settings = ServiceSettings(data_dir=Path(tmp), embedder_cache_dir=EMBEDDER_CACHE,
                                    demo_registry=None, query_token=tokens)
                core = Shortlister.from_settings(settings, start=True)
                try:
                    core.put_registry("demo", tools)
                    base = found_at_1(core)
                    send(core, EVENTS[:attack], WRONG, attacker)
                    poisoned = found_at_1(core)
                    send(core, EVENTS[:LEGITIMATE], RIGHT, honest)
                    repaired = found_at_1(core)
                    report = core.learning_report("demo")
                finally:
                    core.close()
            row = {"deployment": deployment, "attack_events": attack, "found@1": base,
                   "after_attack": poisoned, f"after_{LEGITIMATE}_legitimate": repaired,
                   "counted": report.get("events"), "skipped": report.get("skipped")}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def run_child(root: Path) -> list[dict[str, Any]]:
    paths = [str(root), str(root / "client" / "src")]
    if os.environ.get("BENCH_BASELINE_PYTHONPATH") and root != ROOT:
        paths.insert(0, os.environ["BENCH_BASELINE_PYTHONPATH"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--scenario"], env=env,
                         cwd=root, stdout=subprocess.PIPE, text=True, check=True)
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="revision measured as 'before' (e.g. cc09328)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--scenario", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scenario:
        print(json.dumps(run_scenario()))
        return
    runs: dict[str, list[dict[str, Any]]] = {}
    if args.baseline:
        sys.path.insert(0, str(ROOT / "bench"))
        from common import worktree

        with worktree(args.baseline) as base:
            runs[f"before ({args.baseline})"] = run_child(base)
    runs["after"] = run_child(ROOT)
    legit = f"after_{LEGITIMATE}_legitimate"
    print(f"found@1 of {RIGHT} on {len(PROBES)} held-out rewordings (rank 1); attacker claims {WRONG}")
    print(f"{'checkout':<22} {'deployment':<17} {'attack':>6} {'clean':>6} {'attacked':>9} "
          f"{'+30 legit':>9} {'counted':>8}  skipped")
    for name, rows in runs.items():
        for r in rows:
            print(f"{name:<22} {r['deployment']:<17} {r['attack_events']:>6} {r['found@1']:>6.1f} "
                  f"{r['after_attack']:>9.1f} {r[legit]:>9.1f} {r['counted']!s:>8}  {r['skipped']}")
    if args.out:
        args.out.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
