"""A simulated agent teaches a real server (real MiniLM) which tool its requests mean: the tool
climbs the ranking for a request it never sent, and stays up after a restart."""

from __future__ import annotations

import json
import signal

import httpx
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e
T = 120  # seconds: the CI box may be busy

# A request the agent never sends (the probe) and the ones it does: the same need, other
# names. For these the server ranks search_emails third (create_invoice, send_email first); the
# agent searches its mail every time.
PROBE = "find the email from alice about the invoice"
NAMES = ("bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar", "peggy")
TEACH = [f"find the email from {name} about the invoice" for name in NAMES]
TARGET = "search_emails"


def scored(url: str, query: str) -> dict[str, float]:
    body = httpx.post(f"{url}/shortlist", json={"registry": "agent", "query": query, "k": 10}, timeout=T).json()
    return {t["name"]: t["score"] for t in body["tools"]}


def ranking(url: str, query: str) -> list[str]:
    return list(scored(url, query))


def teach(url: str, queries: list[str]) -> None:
    """Agents (told apart by X-Caller-Id: one caller's repeated claims decay) use TARGET."""
    for i, query in enumerate(queries):
        headers = {"X-Caller-Id": f"agent-{i}"}
        sl = httpx.post(f"{url}/shortlist", json={"registry": "agent", "query": query}, headers=headers,
                        timeout=T).json()
        body = {"shortlist_id": sl["shortlist_id"], "used": [TARGET], "success": True,
                "calls": [{"tool": TARGET, "useful": True}]}
        assert httpx.post(f"{url}/feedback", json=body, headers=headers, timeout=T).status_code == 200


def test_feedback_moves_a_tool_up_and_survives_a_restart(server_factory):
    server = server_factory()
    tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())["tools"]
    assert httpx.put(f"{server.url}/registries/agent", json={"tools": tools}, timeout=T).status_code == 200
    base = scored(server.url, PROBE)
    before = list(base)
    assert before.index(TARGET) > 0
    teach(server.url, TEACH)
    # a request never sent is lifted by its neighbours (12 at cosine ~0.86)
    assert scored(server.url, PROBE)[TARGET] > base[TARGET] + 0.05
    teach(server.url, [PROBE] * 16)  # agents ask this very request again and again
    assert ranking(server.url, PROBE)[0] == TARGET
    # an unrelated request keeps its ranking
    assert ranking(server.url, "convert 100 dollars to euros")[0] == "convert_currency"
    learning = httpx.get(f"{server.url}/registries/agent/report", timeout=T).json()["learning"]
    assert learning["events"] == len(TEACH) + 16 and learning["tools_with_memory"] == 1

    server.stop(signal.SIGTERM)  # a clean stop saves the memory
    again = server_factory()
    assert ranking(again.url, PROBE)[0] == TARGET
    assert httpx.get(f"{again.url}/registries/agent/learning", timeout=T).json()["events"] == len(TEACH) + 16
    # an admin wipe forgets it
    assert httpx.delete(f"{again.url}/registries/agent/learning", timeout=T).status_code == 200
    assert ranking(again.url, PROBE) == before
