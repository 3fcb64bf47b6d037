"""The harvested MCP registries and their labelled tasks agree with what the service accepts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from registry.tools import parse_tools

ROOT = Path(__file__).resolve().parent.parent
REGISTRIES = ROOT / "bench" / "data" / "mcp_registries"
TASKS = ROOT / "bench" / "data" / "mcp_tasks.jsonl"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "mcp_small.json"


def _registry_files() -> list[Path]:
    return sorted(REGISTRIES.glob("*.json"))


def _tasks() -> list[dict]:
    return [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]


def test_there_are_enough_harvested_registries() -> None:
    stems = {p.stem for p in _registry_files()}
    assert len(stems - {"gateway"}) >= 12
    assert "gateway" in stems


@pytest.mark.parametrize("path", _registry_files(), ids=lambda p: p.stem)
def test_every_registry_parses_as_mcp(path: Path) -> None:
    record = json.loads(path.read_text())
    tools = parse_tools(record)
    assert tools and len(tools) == len(record["tools"])
    assert {t.format for t in tools} == {"mcp"}
    assert record["server"] == path.stem
    if path.stem != "gateway":
        assert record["package"] and record["version"]


def test_gateway_is_the_union_of_its_members() -> None:
    sys.path.insert(0, str(ROOT / "bench" / "mcp"))
    try:
        import gateway  # type: ignore[import-not-found]  # bench/mcp, put on sys.path above
    finally:
        sys.path.pop(0)
    stored = json.loads((REGISTRIES / "gateway.json").read_text())
    assert stored == gateway.build(tuple(m["server"] for m in stored["members"]), REGISTRIES)
    assert len(stored["members"]) >= 4


def test_tasks_are_well_formed_and_gold_names_exist() -> None:
    tasks = _tasks()
    names = {
        p.stem: {t.name for t in parse_tools(json.loads(p.read_text()))} for p in _registry_files()
    }
    ids = [t["id"] for t in tasks]
    assert len(ids) == len(set(ids))
    for task in tasks:
        assert set(task) == {"id", "registry", "query", "gold", "kind"}, task["id"]
        assert task["registry"] in names, task["id"]
        assert task["query"].strip(), task["id"]
        gold = task["gold"]
        assert gold and len(gold) == len(set(gold)), task["id"]
        missing = set(gold) - names[task["registry"]]
        assert not missing, f"{task['id']}: {missing} not in {task['registry']}"
        assert task["kind"] == ("single" if len(gold) == 1 else "multi"), task["id"]


def test_task_mix_per_registry() -> None:
    by_registry: dict[str, list[dict]] = {}
    for task in _tasks():
        by_registry.setdefault(task["registry"], []).append(task)
    assert len(by_registry.get("gateway", [])) >= 25
    assert len(by_registry) >= 12
    for registry, tasks in by_registry.items():
        multi = sum(t["kind"] == "multi" for t in tasks)
        assert len(tasks) >= 8, registry
        assert 0.25 <= multi / len(tasks) <= 0.75, registry


def test_small_fixture_is_real_harvested_tools() -> None:
    payload = json.loads(FIXTURE.read_text())
    tools = parse_tools(payload)
    assert len(tools) == 12
    harvested = {
        t["name"]: t for p in _registry_files() if p.stem != "gateway"
        for t in json.loads(p.read_text())["tools"]
    }
    for item in payload:
        assert harvested[item["name"]] == item


def test_benchmark_scores_tasks_on_the_small_fixture(engine) -> None:
    """bench/mcp_registries.py's scoring, run on the fixture with the fast fake embedder."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import mcp_registries as bench  # type: ignore[import-not-found]  # bench/, on sys.path above
    finally:
        sys.path.pop(0)
    n = engine.writer.put_registry("small", json.loads(FIXTURE.read_text())).tools
    tasks = [
        {"id": "a", "registry": "small", "query": "post a message to the releases channel",
         "gold": ["slack_post_message"], "kind": "single"},
        {"id": "b", "registry": "small", "query": "read notes.md and post it to slack",
         "gold": ["read_text_file", "slack_post_message"], "kind": "multi"},
    ]
    outcomes = bench.run(engine, tasks, {"small": n})
    assert [len(o.fixed[k]) for o in outcomes for k in bench.FIXED_KS] == [1, 3, 5, 1, 3, 5]
    assert all(1 <= r <= n for o in outcomes for r in o.gold_ranks)
    summary = bench.summarise(outcomes)
    assert summary["tasks"] == 2 and summary["multi"] == 1
    assert summary["fixed"]["1"]["all"] <= 0.5  # the multi task cannot be complete at K=1
    for key in ("any", "all"):
        assert 0 <= summary[key] <= 1
        shares = [summary["fixed"][str(k)][key] for k in bench.FIXED_KS]
        assert shares == sorted(shares)
    assert summary["any"] >= summary["all"]
    assert 1 <= summary["mean_k"] <= n
