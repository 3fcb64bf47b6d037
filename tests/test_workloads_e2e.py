"""End to end on a real agent workload: a 12-tool MCP registry (real slack + filesystem tools),
the real server process, the real MiniLM and the shipped policy."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

MCP_TOOLS = json.loads((ROOT / "tests" / "fixtures" / "mcp_small.json").read_text())

CLEAR = {
    "tell the #backend channel that the deploy is done": "slack_post_message",
    "read config.yaml from the project folder": "read_text_file",
    "react with a thumbs up to that message": "slack_add_reaction",
    "who is in our slack workspace?": "slack_get_users",
    "what files are in the docs directory": "list_directory",
}


def shortlist(url: str, query: str, **extra: object) -> httpx.Response:
    return httpx.post(
        f"{url}/shortlist", json={"registry": "mcp", "query": query, **extra}, timeout=60
    )


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory, minilm_cache):
    """One real server for the module, holding the 12-tool registry."""
    from tests.server import Servers

    servers = Servers(tmp_path_factory.mktemp("workloads"), minilm_cache)
    server = servers.start()
    r = httpx.put(f"{server.url}/registries/mcp", json=MCP_TOOLS, timeout=60)
    assert r.status_code == 200 and r.json()["tools"] == 12
    yield server
    servers.close()


def test_clear_queries_get_one_to_three_tools_never_the_registry(mcp_server):
    for query, gold in CLEAR.items():
        body = shortlist(mcp_server.url, query).json()
        names = [t["name"] for t in body["tools"]]
        assert gold in names, (query, names)
        assert 1 <= body["k"] <= 3, (query, names)
        biased = shortlist(mcp_server.url, query, depth_bias=10).json()
        assert biased["k"] < 12, (query, biased["k"])  # only k may ask for the whole registry
    assert shortlist(mcp_server.url, "anything at all", k=12).json()["k"] == 12


def test_a_two_intent_request_gets_both_tools(mcp_server):
    body = shortlist(
        mcp_server.url,
        "read the release notes from notes.md and then post them to the #releases channel",
    ).json()
    names = [t["name"] for t in body["tools"]]
    assert {"read_text_file", "slack_post_message"} <= set(names), names
    assert len(body["intents"]) == 2
    assert body["k"] <= 6


def test_a_40k_character_message_is_answered(mcp_server):
    log = " ".join(f"line {i}: worker heartbeat ok, queue depth {i % 17}" for i in range(900))
    message = f"{log}\n\nWrite this log to a new file called heartbeat.log, please."
    assert len(message) >= 40_000
    r = shortlist(mcp_server.url, message)
    assert r.status_code == 200, r.text
    names = [t["name"] for t in r.json()["tools"]]
    assert "write_file" in names, names


def test_a_tool_named_verbatim_is_rank_one(mcp_server):
    for query, name in [
        ("use slack_get_thread_replies on the last incident thread", "slack_get_thread_replies"),
        ("run `search_files` for *.md", "search_files"),
        ("Look up U123 with slack_get_user_profile.", "slack_get_user_profile"),
    ]:
        body = shortlist(mcp_server.url, query).json()
        first = body["tools"][0]
        assert (first["name"], first["rank"], first["named"]) == (name, 1, True), (query, body["tools"])
        fixed = shortlist(mcp_server.url, query, k=1).json()
        assert fixed["tools"][0]["name"] == name


def test_allow_empty_answers_nothing_for_an_unrelated_request(mcp_server):
    unrelated = shortlist(
        mcp_server.url, "what is the integral of x squared times sine of x", allow_empty=True
    ).json()
    assert unrelated["k"] == 0 and unrelated["tools"] == [], unrelated
    assert 0.0 <= unrelated["confidence"] < 0.5
    related = shortlist(mcp_server.url, "post hello to #general on slack", allow_empty=True).json()
    assert related["k"] >= 1 and related["confidence"] > unrelated["confidence"]
    assert shortlist(mcp_server.url, "post hello to #general").json()["confidence"] is None


def test_a_repeated_message_is_answered_from_the_query_cache(mcp_server):
    def lookups(result: str) -> float:
        text = httpx.get(f"{mcp_server.url}/metrics", timeout=10).text
        prefix = f'shortlist_query_embedding_cache_lookups_total{{result="{result}"}}'
        return float(next(line for line in text.splitlines() if line.startswith(prefix)).split()[-1])

    query = "list the public channels of our workspace, please"
    first = shortlist(mcp_server.url, query).json()
    hits = lookups("hit")
    again = shortlist(mcp_server.url, f"  {query} ").json()  # same words: the same embedding
    assert lookups("hit") == hits + 1
    assert [t["name"] for t in again["tools"]] == [t["name"] for t in first["tools"]]
    assert [t["score"] for t in again["tools"]] == [t["score"] for t in first["tools"]]
