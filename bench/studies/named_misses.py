"""The named misses on real MCP servers: where each needed tool ranks, and whether it is shown.

An in-process core as the service builds it (the shipped depth policy, the demo registry), with
the tuned embedder read from ``--artifact`` (default: ``models/tuned-embedder``; a candidate
fine-tune's directory compares it), and the harvested ``tools/list`` of the github, memory and
filesystem servers (``bench/data/mcp_registries``). Prints, per request, the needed tool's rank
in a 30-deep list and the list the default shows.

    python bench/studies/named_misses.py [--artifact data/ft16/shipped] [--embedder tuned]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from registry.core import Shortlister  # noqa: E402
from registry.request import ShortlistRequest  # noqa: E402
from service.settings import ServiceSettings  # noqa: E402

CASES = [
    ("github", "open a PR from feature-x into main", "create_pull_request"),
    ("github", "create a PR", "create_pull_request"),
    ("memory", "remember that Alice works at Acme", "create_entities"),
    ("demo", "what will the weather be in Paris tomorrow", "get_weather_forecast"),
    ("filesystem", "save this summary as notes.md", "write_file"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", type=Path, default=ROOT / "models" / "tuned-embedder")
    ap.add_argument("--embedder", default="tuned")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="misses-") as tmp:
        settings = ServiceSettings(
            data_dir=Path(tmp), demo_registry=str(ROOT / "examples" / "demo_tools.json"), embedder=args.embedder,
            tuned_embedder_dir=args.artifact, embedder_cache_dir=Path(tmp) / "embedder",
        )
        core = Shortlister.from_settings(settings, start=True)
        try:
            for name in ("github", "memory", "filesystem"):
                harvest = json.loads((ROOT / "bench" / "data" / "mcp_registries" / f"{name}.json").read_text())
                core.put_registry(name, {"tools": harvest["tools"]})
            for registry, query, needed in CASES:
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
