"""Write, per source, the requests a fine-tune never trained on: known tools, new phrasings.

    python bench/studies/unseen_split.py --manifest models/tuned-embedder/manifest.json --out data/unseen

The shipped tuned embedder trained on a seeded subsample of every source's requests (its
manifest's ``subsample``); the rest are new phrasings for tools it saw, which is what an agent
on a popular registry sends. Each source with such requests gets ``OUT/<source>/`` holding its
``tools.json`` (and ``names_map.json``) and a ``queries.jsonl`` of those requests only, so
``shortlist train --data OUT/*`` and ``bench/peers.py`` read them as any source. Sources every
request of which was trained on are skipped.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import source_dirs, trained_queries  # noqa: E402


def write_unseen(directory: Path, manifest: Path, out: Path) -> int:
    """Write ``directory``'s untrained requests under ``out``; returns how many (0: nothing written)."""
    lines = (directory / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    lines = [line for line in lines if line.strip()]
    seen = trained_queries(manifest, directory.name, lines)
    kept = [line for i, line in enumerate(lines) if i not in seen]
    if not kept:
        return 0
    target = out / directory.name
    target.mkdir(parents=True, exist_ok=True)
    for name in ("tools.json", "names_map.json"):
        if (directory / name).is_file():
            shutil.copyfile(directory / name, target / name)
    (target / "queries.jsonl").write_text("\n".join(kept) + "\n", encoding="utf-8")
    return len(kept)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", type=Path, default=ROOT / "models" / "tuned-embedder" / "manifest.json")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--extra", type=Path, nargs="*", default=[], help="more source directories")
    args = ap.parse_args(argv)
    for directory in [*source_dirs(), *args.extra]:
        n = write_unseen(directory, args.manifest, args.out)
        print(f"{directory.name}: {n} untrained requests" + ("" if n else " (skipped)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
