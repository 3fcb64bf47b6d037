"""End to end on a real MCP server's tools: the real server process, the real MiniLM, the
shipped policy. A request needing two tools of one MCP server gets both; a single-tool request
still stops early."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

# the real `tools/list` of @modelcontextprotocol/server-filesystem (bench/data/mcp_registries)
FILESYSTEM = json.loads((ROOT / "bench" / "data" / "mcp_registries" / "filesystem.json").read_text())
READERS = {"read_text_file", "read_file", "read_multiple_files"}

TWO_TOOL_TASKS = [
    ("read notes/todo.md and then write a cleaned-up copy of it to notes/done.md", READERS, {"write_file"}),
    ("create a folder called archive and move old.log into it", {"create_directory"}, {"move_file"}),
]


@pytest.fixture(scope="module")
def fs_server(tmp_path_factory, minilm_cache):
    from tests.server import Servers

    servers = Servers(tmp_path_factory.mktemp("needs"), minilm_cache)
    server = servers.start()
    r = httpx.put(f"{server.url}/registries/fs", json={"tools": FILESYSTEM["tools"]}, timeout=60)
    assert r.status_code == 200 and r.json()["tools"] == len(FILESYSTEM["tools"])
    yield server
    servers.close()


def _names(url: str, query: str) -> tuple[list[str], int]:
    body = httpx.post(f"{url}/shortlist", json={"registry": "fs", "query": query}, timeout=60).json()
    return [t["name"] for t in body["tools"]], body["k"]


@pytest.mark.parametrize(("query", "first", "second"), TWO_TOOL_TASKS)
def test_a_request_needing_two_tools_of_one_server_gets_both(fs_server, query, first, second):
    names, k = _names(fs_server.url, query)
    assert set(names) & first and set(names) & second, (query, names)
    assert k <= len(FILESYSTEM["tools"]) // 2, (query, names)


def test_a_single_tool_request_still_stops_early(fs_server):
    names, k = _names(fs_server.url, "show me the directory tree of src")
    assert "directory_tree" in names and k <= 3, names
