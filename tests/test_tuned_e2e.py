"""End to end with the shipped tuned embedder (the default): a real server, the real 14-tool
filesystem MCP registry (`@modelcontextprotocol/server-filesystem` tools/list,
tests/fixtures/mcp_filesystem.json) and the 26-tool desktop-commander server
(`@wonderwhy-er/desktop-commander` 0.2.52 tools/list in bench/data/mcp_registries, harvested by
bench/mcp/harvest.py: a server none of the fine-tune's training data came from)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

FILESYSTEM = json.loads((ROOT / "tests" / "fixtures" / "mcp_filesystem.json").read_text())
DESKTOP_COMMANDER = json.loads((ROOT / "bench" / "data" / "mcp_registries" / "desktop-commander.json").read_text())


@pytest.fixture(scope="module")
def tuned_server(tmp_path_factory, minilm_cache):
    from tests.server import Servers

    # minilm_cache already holds the tuned export (tests/conftest.py), so the server only loads it
    servers = Servers(tmp_path_factory.mktemp("tuned"), minilm_cache)
    server = servers.start(embedder="tuned")
    r = httpx.put(f"{server.url}/registries/fs", json=FILESYSTEM, timeout=300)
    assert r.status_code == 200 and r.json()["tools"] == len(FILESYSTEM["tools"]) == 14
    r = httpx.put(f"{server.url}/registries/dc", json=DESKTOP_COMMANDER, timeout=300)
    assert r.status_code == 200 and r.json()["tools"] == len(DESKTOP_COMMANDER["tools"]) == 26
    yield server
    servers.close()


def _names(url: str, query: str, registry: str = "fs", **extra: object) -> list[str]:
    r = httpx.post(f"{url}/shortlist", json={"registry": registry, "query": query, **extra}, timeout=60)
    assert r.status_code == 200, r.text
    return [t["name"] for t in r.json()["tools"]]


def test_save_this_summary_ranks_write_file_first(tuned_server):
    # Issue 19's case: plain MiniLM ranks get_file_info first and write_file second.
    assert _names(tuned_server.url, "save this summary as notes.md")[0] == "write_file"


def test_a_request_for_two_tools_of_the_server_gets_both(tuned_server):
    names = _names(tuned_server.url, "create the folder reports and then write summary.md into it")
    assert {"create_directory", "write_file"} <= set(names), names


def test_the_registry_report_names_the_tuned_model(tuned_server):
    body = httpx.get(f"{tuned_server.url}/registries/fs", timeout=30).json()
    assert "tool-finetune" in json.dumps(body)


def test_desktop_commander_shows_write_file_for_a_report_to_save(tuned_server):
    # Issue 19's case: plain MiniLM puts give_feedback_to_desktop_commander first and shows no
    # write_file (measured: give_feedback, get_recent_tool_calls, read_file, write_pdf, ...).
    names = _names(tuned_server.url, "Give me a markdown report on last week's sales in ~/reports/sales.md", "dc")
    assert "write_file" in names and names[0] != "give_feedback_to_desktop_commander", names
    saved = _names(tuned_server.url, "save this summary as notes.md", "dc")
    assert saved[0] == "write_file" and len(saved) < 6, saved  # MiniLM: get_usage_stats first, 6 tools
