"""Write the project's MCP tasks as one more training/LOSO source in the common data format.

    python bench/mcp/corpus_source.py

Reads every harvested server under ``bench/data/mcp_registries`` (not the gateway, which is a
union of some of them) and ``bench/data/mcp_tasks.jsonl``, and writes ``bench/data/mcp_servers/``
(``tools.json``, ``queries.jsonl``): one registry of all the servers' tools, so each task is
ranked against every server's tools, as an agent with all of them installed would see them.
A name that two servers share is prefixed with its server (``<stem>__<name>``, as
:mod:`bench.mcp.gateway` does) and each task's gold follows its server's rename.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.mcp.gateway import MEMBERS as GATEWAY_MEMBERS
from bench.mcp.gateway import OUT_DIR as REGISTRIES
from bench.mcp.gateway import build

TASKS = REGISTRIES.parent / "mcp_tasks.jsonl"
OUT = REGISTRIES.parent / "mcp_servers"


def servers() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in REGISTRIES.glob("*.json") if p.stem != "gateway"))


def renamed_gold(
    server: str, gold: list[str], renamed: set[str], members: tuple[str, ...]
) -> list[str]:
    """``gold`` of a task on ``server`` in the union's names (the gateway's tasks: its members)."""
    owners = members if server == "gateway" else (server,)
    out = []
    for name in gold:
        if name not in renamed:
            out.append(name)
            continue
        owner = next(s for s in owners if name in tool_names(s))
        out.append(f"{owner}__{name}")
    return out


def tool_names(stem: str) -> set[str]:
    return {t["name"] for t in json.loads((REGISTRIES / f"{stem}.json").read_text())["tools"]}


def main() -> None:
    stems = servers()
    union = build(stems, REGISTRIES)
    renamed = set(union["renamed"])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "tools.json").write_text(json.dumps(union["tools"], indent=1, ensure_ascii=False) + "\n")
    names = {t["name"] for t in union["tools"]}
    rows = []
    for line in TASKS.read_text().splitlines():
        task = json.loads(line)
        gold = renamed_gold(task["registry"], task["gold"], renamed, GATEWAY_MEMBERS)
        assert set(gold) <= names, (task["id"], gold)
        rows.append({"id": task["id"], "query": task["query"], "gold": gold})
    (OUT / "queries.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    )
    print(
        f"{len(union['tools'])} tools from {len(stems)} servers (renamed {sorted(renamed)}), "
        f"{len(rows)} tasks -> {OUT}"
    )


if __name__ == "__main__":
    main()
