"""Build the "gateway" registry: the union of a few harvested MCP servers, as one agent sees it.

    python bench/mcp/gateway.py

Reads ``bench/data/mcp_registries/<stem>.json`` for each member and writes ``gateway.json`` with
the tools in member order. Names stay as the servers publish them; a name that two members share
is prefixed with its server (``<stem>__<name>``) in both.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

OUT_DIR = Path(__file__).resolve().parents[2] / "bench" / "data" / "mcp_registries"
MEMBERS = ("filesystem", "github", "slack", "brave-search", "memory", "google-maps")


def build(members: tuple[str, ...] = MEMBERS, src: Path = OUT_DIR) -> dict[str, Any]:
    records = [json.loads((src / f"{stem}.json").read_text()) for stem in members]
    counts = collections.Counter(t["name"] for r in records for t in r["tools"])
    tools = []
    for record in records:
        for tool in record["tools"]:
            name = tool["name"]
            if counts[name] > 1:
                name = f"{record['server']}__{name}"
            tools.append({**tool, "name": name})
    return {
        "server": "gateway",
        "members": [{"server": r["server"], "package": r["package"], "version": r["version"],
                     "tools": len(r["tools"])} for r in records],
        "renamed": sorted(n for n, c in counts.items() if c > 1),
        "tools": tools,
    }


def main() -> None:
    record = build()
    path = OUT_DIR / "gateway.json"
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(record['tools'])} tools from {len(record['members'])} servers, "
          f"renamed {record['renamed'] or 'none'} -> {path}")


if __name__ == "__main__":
    main()
