"""End to end with the shipped models: requests a new user types on real MCP servers' tools/list
get the tool they need in the list. A real `shortlist serve` process with its defaults (the
tuned MiniLM, hybrid scorer, shipped depth policy, the demo registry), and the tools/list of
`@modelcontextprotocol/server-github` 2025.4.8 (26 tools) and `server-memory` 2026.8.31
(9 tools) as harvested over stdio by bench/mcp/harvest.py (bench/data/mcp_registries)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

HARVESTS = ROOT / "bench" / "data" / "mcp_registries"


@pytest.fixture(scope="module")
def server(tmp_path_factory, minilm_cache):
    from tests.server import Servers

    servers = Servers(tmp_path_factory.mktemp("named"), minilm_cache)
    server = servers.start(demo_registry=str(ROOT / "examples" / "demo_tools.json"))
    for name, count in (("github", 26), ("memory", 9)):
        harvest = json.loads((HARVESTS / f"{name}.json").read_text())
        r = httpx.put(f"{server.url}/registries/{name}", json={"tools": harvest["tools"]}, timeout=300)
        assert r.status_code == 200 and r.json()["tools"] == count, r.text
    yield server
    servers.close()


def _names(url: str, registry: str, query: str) -> list[str]:
    r = httpx.post(f"{url}/shortlist", json={"registry": registry, "query": query}, timeout=60)
    assert r.status_code == 200, r.text
    return [t["name"] for t in r.json()["tools"]]


def test_open_a_pr_shows_create_pull_request(server):
    # As typed (no shorthand expansion): push_files alone, create_pull_request 7th in the ranking;
    # "create a PR": create_pull_request 5th of 6, after create_repository, create_issue, ...
    names = _names(server.url, "github", "open a PR from feature-x into main")
    assert "create_pull_request" in names, names
    assert _names(server.url, "github", "create a PR")[0] == "create_pull_request"
