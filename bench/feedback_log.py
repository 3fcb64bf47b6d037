"""What compaction buys: start-up replay time and disk use of the local feedback log.

    python bench/feedback_log.py --events 500000

Writes ``--events`` realistic events (a 30-tool registry, 3-5 tools shown, calls on half of
them) spread over ``--hours`` of received times into a fresh log, then measures, before and
after one compaction that keeps the last hour (the default live window): the log's size, the
time a restarting service spends restoring the counts (checkpoint + replay, as
``FeedbackRecorder.restore``), and the compaction itself. Both restores must give identical
counts. Appends are written without fsync here (the format is the same; fsync per append is
what the service does, and is not what this measures).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from registry.feedback import (  # noqa: E402
    EquivalenceClasses,
    FeedbackRecorder,
    LiveWindow,
    LocalFeedbackLog,
    ShortlistMemory,
    ShownShortlist,
    ToolEfficiency,
    build_event,
)

TOOLS = [f"tool_{i:02d}" for i in range(30)]


def make_events(n: int, start: float, hours: float, seed: int = 0) -> list:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        shown = tuple(rng.sample(TOOLS, rng.randint(3, 5)))
        used = [shown[0]] if rng.random() < 0.8 else [rng.choice(TOOLS)]
        calls = [{"tool": t, "useful": rng.random() < 0.7} for t in shown[:2]] if i % 2 else []
        sl = ShownShortlist(f"s{i}", "bench", 1, len(TOOLS), len(shown), shown, start)
        out.append(build_event(sl, used, calls, True, TOOLS, EquivalenceClasses(),
                               start + hours * 3600 * i / n))
    return out


def restore(path: Path, now: float) -> tuple[float, dict]:
    started = time.perf_counter()
    log = LocalFeedbackLog(path)
    rec = FeedbackRecorder(ShortlistMemory(), log, LiveWindow(3600, clock=lambda: now), ToolEfficiency(),
                           clock=lambda: now)
    rec.restore()
    seconds = time.perf_counter() - started
    log.close()
    return seconds, rec.efficiency.to_state()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=500_000)
    ap.add_argument("--hours", type=float, default=24 * 7)
    args = ap.parse_args()
    now = time.time()
    start = now - args.hours * 3600
    print(f"building {args.events:,} events over {args.hours:g} h ...", file=sys.stderr)
    events = make_events(args.events, start, args.hours)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "feedback" / "events.jsonl"
        fsync = os.fsync
        os.fsync = lambda fd: None  # bulk load only; the service fsyncs every append
        try:
            with LocalFeedbackLog(path) as log:
                for e in events:
                    log.append(e)
        finally:
            os.fsync = fsync
        size_before = path.stat().st_size
        t_before, counts_before = restore(path, now)
        with LocalFeedbackLog(path) as log:
            started = time.perf_counter()
            folded = log.compact(now - 3600 - 600)
            t_compact = time.perf_counter() - started
            kept = log.pending_events()
        size_after = path.stat().st_size
        archive = sum(f.stat().st_size for f in (path.parent / "archive").glob("*.gz"))
        checkpoint = (path.parent / "checkpoint.json").stat().st_size
        t_after, counts_after = restore(path, now)
        assert counts_after == counts_before, "compaction changed the counts"
    mib = 1 << 20
    print("| | events in the log | log size | restore (start-up) |\n|---|---|---|---|")
    print(f"| before compaction | {args.events:,} | {size_before / mib:.1f} MiB | {t_before:.2f} s |")
    print(f"| after compaction | {kept:,} | {size_after / mib:.2f} MiB "
          f"(+ checkpoint {checkpoint / 1024:.1f} KiB) | {t_after:.3f} s |")
    print(f"\ncompaction: {folded:,} events folded in {t_compact:.2f} s; archive {archive / mib:.1f} MiB gzipped "
          f"({100 * archive / size_before:.0f}% of the raw log); counts identical: yes")


if __name__ == "__main__":
    main()
