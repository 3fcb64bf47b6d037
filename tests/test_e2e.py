"""End to end: the real server process, the real MiniLM (ONNX) and the shipped ONNX policy."""

from __future__ import annotations

import itertools
import json
import signal

import httpx
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

KNOWN = {
    "What's the weather like in Paris right now?": "get_weather",
    "convert 100 dollars to euros": "convert_currency",
    "email the quarterly report to bob@example.com": "send_email",
    "book me a flight from JFK to LAX next friday": "book_flight",
    "read the contents of the file config.yaml": "filesystem/read_file",
    "what is 10 factorial": "math.factorial",
    "open a GitHub issue about the login crash": "github.create_issue",
    "tell the #general Slack channel that the deploy is done": "slack.post_message",
}


def test_real_server_finds_known_tools_and_survives_a_restart(server_factory):
    tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())
    server = server_factory()
    r = httpx.put(f"{server.url}/registries/e2e", json=tools, timeout=60)
    assert r.status_code == 200 and r.json()["tools"] == len(tools["tools"])

    answers = {}
    for query, gold in KNOWN.items():
        body = httpx.post(f"{server.url}/shortlist", json={"registry": "e2e", "query": query}).json()
        names = [t["name"] for t in body["tools"]]
        assert gold in names, (query, names)
        assert body["k"] == len(names) and body["policy"] == "bor"
        answers[query] = names

    metrics = httpx.get(f"{server.url}/metrics").text
    assert f'shortlist_requests_total{{policy="bor",registry="e2e"}} {float(len(KNOWN))}' in metrics

    server.stop(signal.SIGKILL)  # an acknowledged upload must survive a crash
    again = server_factory()
    listed = httpx.get(f"{again.url}/registries").json()["registries"]
    assert [{k: v for k, v in row.items() if k != "written_at"} for row in listed] == [
        {"registry": "e2e", "version": 1, "tools": len(tools["tools"])}
    ]
    assert isinstance(listed[0]["written_at"], float)  # the stored write time, read back
    for query, names in answers.items():
        body = httpx.post(f"{again.url}/shortlist", json={"registry": "e2e", "query": query}).json()
        assert [t["name"] for t in body["tools"]] == names


def test_every_policy_and_scorer_with_the_real_model(server_factory):
    """gap, threshold and fixed on real MiniLM scores, not only on the fake embedder."""
    tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())
    server = server_factory(threshold="0.5")
    httpx.put(f"{server.url}/registries/e2e", json=tools, timeout=60).raise_for_status()
    for scorer in ("hybrid", "dense", "bm25"):
        for policy in ("gap", "threshold", "fixed"):
            for query, gold in KNOWN.items():
                body = httpx.post(
                    f"{server.url}/shortlist",
                    json={"registry": "e2e", "query": query, "policy": policy, "scorer": scorer,
                          "max_k": 10},
                ).json()
                scores = [t["score"] for t in body["tools"]]
                assert body["policy"] == policy and 1 <= body["k"] <= 10
                assert scores == sorted(scores, reverse=True)
                if policy == "fixed":
                    assert body["k"] == 5  # SHORTLIST_FIXED_K
                if policy == "threshold" and body["k"] > 1:
                    assert min(scores) >= 0.5
                if policy == "gap" and body["k"] < 10:
                    deeper = httpx.post(
                        f"{server.url}/shortlist",
                        json={"registry": "e2e", "query": query, "scorer": scorer, "k": 11},
                    ).json()["tools"]
                    drops = [a["score"] - b["score"] for a, b in itertools.pairwise(deeper)]
                    assert body["k"] == drops.index(max(drops)) + 1
                if scorer == "hybrid":  # plain MiniLM puts a mortgage tool above send_email once
                    assert body["tools"][0]["name"] == gold, (query, scorer, policy)


def test_depth_bias_knob_on_the_real_model(server_factory):
    """The bor operating knob on real MiniLM scores and the shipped policy: per query the list
    never gets shorter as the bias grows, the extremes give 1 tool and the cap, and the
    server-wide default (SHORTLIST_DEPTH_BIAS) applies when a request sends none."""
    tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())
    server = server_factory(depth_bias="0.5")
    httpx.put(f"{server.url}/registries/e2e", json=tools, timeout=60).raise_for_status()

    def shortlist(query: str, **extra) -> dict:
        body = {"registry": "e2e", "query": query, "max_k": 12, **extra}
        return httpx.post(f"{server.url}/shortlist", json=body).raise_for_status().json()

    means = {}
    for bias in (-10.0, -1.0, 0.0, 0.5, 1.0, 10.0):
        means[bias] = [shortlist(q, depth_bias=bias)["k"] for q in KNOWN]
    for i, query in enumerate(KNOWN):
        ks = [means[b][i] for b in sorted(means)]
        assert ks == sorted(ks), (query, ks)
        default = shortlist(query)
        assert default["depth_bias"] == 0.5 and default["k"] == means[0.5][i]
        assert default["tools"][0]["name"] == KNOWN[query]
    assert set(means[-10.0]) == {1} and set(means[10.0]) == {12}
    assert sum(means[-1.0]) < sum(means[1.0])


def test_writes_to_an_hnsw_registry_with_the_real_model(server_factory):
    """The demo registry served from HNSW (SHORTLIST_HNSW_MIN_TOOLS=10) with real MiniLM: after an
    upsert, a changed description and a delete (graph derived, old slots masked) every query
    still finds its tool, the new one is found, the deleted one never comes back, and a
    restart (graph rebuilt from scratch) answers the same."""
    tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())
    server = server_factory(hnsw_min_tools="10")
    url = server.url
    httpx.put(f"{url}/registries/h", json=tools, timeout=60).raise_for_status()
    new = {"name": "zebra_census", "description": "Count the zebras seen in a national park survey."}
    httpx.post(f"{url}/registries/h/tools", json=[new], timeout=60).raise_for_status()
    changed = {"name": "book_flight", "description": "Reserve a table at a restaurant for tonight."}
    httpx.post(f"{url}/registries/h/tools", json=[changed], timeout=60).raise_for_status()
    httpx.delete(f"{url}/registries/h/tools/send_email", timeout=60).raise_for_status()

    def top(query: str, k: int = 1) -> list[str]:
        body = {"registry": "h", "query": query, "scorer": "dense", "k": k}
        return [t["name"] for t in httpx.post(f"{url}/shortlist", json=body).json()["tools"]]

    def answers() -> dict[str, list[str]]:
        queries = {q: top(q) for q, gold in KNOWN.items() if gold not in ("send_email", "book_flight")}
        queries["how many zebras are in the park?"] = top("how many zebras are in the park?")
        queries["book a restaurant table tonight"] = top("book a restaurant table tonight")
        return queries

    before = answers()
    for query, gold in KNOWN.items():
        if gold not in ("send_email", "book_flight"):
            assert before[query] == [gold], query
    assert before["how many zebras are in the park?"] == ["zebra_census"]
    assert before["book a restaurant table tonight"] == ["book_flight"]
    assert "send_email" not in top("email the quarterly report to bob@example.com", k=29)
    assert len(top("anything at all", k=50)) == 30  # 30 demo tools + 1 new - 1 deleted
    server.stop(signal.SIGTERM)
    again = server_factory(hnsw_min_tools="10")
    url = again.url
    assert answers() == before
