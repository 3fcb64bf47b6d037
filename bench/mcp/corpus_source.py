"""Write the project's MCP tasks as one more training/LOSO source in the common data format.

    python bench/mcp/corpus_source.py

Reads every harvested server under ``bench/data/mcp_registries`` (not the gateway, which is a
union of some of them, nor the :data:`HELD_OUT` servers) and ``bench/data/mcp_tasks.jsonl``, and writes ``bench/data/mcp_servers/``
(``tools.json``, ``queries.jsonl``): one registry of all the servers' tools, so each task is
ranked against every server's tools, as an agent with all of them installed would see them.
A name that two servers share is prefixed with its server (``<stem>__<name>``, by
:func:`bench.mcp.gateway.build`) and each task's gold follows its server's rename.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.mcp.gateway import MEMBERS as GATEWAY_MEMBERS
from bench.mcp.gateway import OUT_DIR as REGISTRIES
from bench.mcp.gateway import build

TASKS = REGISTRIES.parent / "mcp_tasks.jsonl"
OUT = REGISTRIES.parent / "mcp_servers"
#: Harvested after the tuned embedder's corpus was built and kept out of it, so the shipped
#: model is checked on a server it never saw (tests/test_tuned_e2e.py).
HELD_OUT = frozenset({"desktop-commander"})


def build_source() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The union's tools and the tasks (``id``, ``query``, ``gold``) in the union's names."""
    stems = sorted(p.stem for p in REGISTRIES.glob("*.json") if p.stem != "gateway" and p.stem not in HELD_OUT)
    union = build(tuple(stems), REGISTRIES)
    renamed = set(union["renamed"])
    owners: dict[str, list[str]] = {}  # a shared name -> the servers that publish it
    for stem in stems:
        for tool in json.loads((REGISTRIES / f"{stem}.json").read_text())["tools"]:
            if tool["name"] in renamed:
                owners.setdefault(tool["name"], []).append(stem)

    def union_name(server: str, name: str) -> str:
        if name not in renamed:
            return name
        members = GATEWAY_MEMBERS if server == "gateway" else (server,)
        return f"{next(s for s in owners[name] if s in members)}__{name}"

    names = {t["name"] for t in union["tools"]}
    rows = []
    for line in TASKS.read_text().splitlines():
        task = json.loads(line)
        gold = [union_name(task["registry"], g) for g in task["gold"]]
        assert set(gold) <= names, (task["id"], gold)
        rows.append({"id": task["id"], "query": task["query"], "gold": gold})
    return union["tools"], rows


def main() -> None:
    tools, rows = build_source()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "tools.json").write_text(json.dumps(tools, indent=1, ensure_ascii=False) + "\n")
    (OUT / "queries.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(tools)} tools, {len(rows)} tasks -> {OUT}")


if __name__ == "__main__":
    main()
