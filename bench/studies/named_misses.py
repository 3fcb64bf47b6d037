"""The named misses on real MCP servers: where each needed tool ranks, and whether it is shown.

An in-process core as the service builds it (the shipped depth policy; no exploration, so the
lists repeat), with the tuned embedder read from ``--artifact`` (default:
``models/tuned-embedder``; a candidate fine-tune's directory compares it), and each registry file
of ``bench.common.NAMED_MISSES`` (harvested ``tools/list`` files and the demo registry) uploaded
under its file's stem. Prints, per request, the needed tool's rank in a 30-deep list and the list
the default shows.

    python bench/studies/named_misses.py [--artifact data/ft16/shipped] [--embedder tuned]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import NAMED_MISSES, ROOT
from registry.core import Shortlister
from registry.request import ShortlistRequest
from service.settings import ServiceSettings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", type=Path, default=ROOT / "models" / "tuned-embedder")
    ap.add_argument("--embedder", default="tuned")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="misses-") as tmp:
        settings = ServiceSettings(
            data_dir=Path(tmp), demo_registry=None, embedder=args.embedder, explore_share=0.0,
            tuned_embedder_dir=args.artifact, embedder_cache_dir=Path(tmp) / "embedder",
        )
        core = Shortlister.from_settings(settings, start=True)
        try:
            for path in sorted({path for path, _, _ in NAMED_MISSES}):
                core.put_registry(Path(path).stem, {"tools": json.loads((ROOT / path).read_text())["tools"]})
            for path, query, needed in NAMED_MISSES:
                registry = Path(path).stem
                shown = [t.name for t in core.shortlist(ShortlistRequest(registry=registry, query=query)).tools]
                deep = [t.name for t in core.shortlist(ShortlistRequest(registry=registry, query=query, k=30)).tools]
                rank = deep.index(needed) + 1 if needed in deep else None
                print(f"{registry:10} {query!r}: {needed} ranked {rank}, {'shown' if needed in shown else 'NOT shown'} "
                      f"in {shown}")
        finally:
            core.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
