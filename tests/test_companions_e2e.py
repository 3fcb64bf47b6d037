"""Learned companions on a real server (real MiniLM, real ONNX policy): agents' feedback with
their calls, a refit, and the companion appears in ``/shortlist`` with its reason (``explain``),
in ``GET /registries/{r}/graph`` with its evidence, and again after a restart."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from tests.test_companions import CITIES, PAIR
from tests.test_graph import REST
from tool_shortlist_client import ShortlistClient

pytestmark = pytest.mark.e2e

QUERY = "cheap flights from london to boston"


def shortlist(url: str, **body) -> list[dict]:
    r = httpx.post(f"{url}/shortlist", json={"registry": "shop", "query": QUERY, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["tools"]


def teach(url: str, n: int = 16) -> None:
    """Three agents find flights, then check the weather at the destination."""
    for i in range(n):
        headers = {"X-Caller-Id": f"agent-{i % 3}"}
        query = f"flights from {CITIES[i % len(CITIES)]} to {CITIES[(i + 3) % len(CITIES)]} next week"
        sl = httpx.post(f"{url}/shortlist", json={"registry": "shop", "query": query}, headers=headers, timeout=60)
        calls = [{"tool": "search_airport", "useful": True}, {"tool": PAIR[0], "useful": True},
                 {"tool": PAIR[1], "useful": True}]  # fmt: skip
        fb = httpx.post(f"{url}/feedback", json={"shortlist_id": sl.json()["shortlist_id"], "used": list(PAIR),
                                                "calls": calls, "success": True}, headers=headers, timeout=60)  # fmt: skip
        assert fb.status_code == 200, fb.text


def test_feedback_then_a_refit_and_the_companion_is_shown_with_its_reason(tmp_path: Path, minilm_cache: Path):
    from tests.server import Servers

    servers = Servers(tmp_path, minilm_cache)
    try:
        server = servers.start(explore_share="0")
        with ShortlistClient(server.url) as admin:
            admin.put_registry("shop", REST)
        before = [t["name"] for t in shortlist(server.url)]
        assert PAIR[0] in before and PAIR[1] not in before
        teach(server.url)
        assert [t["name"] for t in shortlist(server.url)] == before  # nothing ships before a refit
        refit = httpx.post(f"{server.url}/registries/shop/policies/refit", json={}, timeout=120)
        assert refit.status_code == 200 and refit.json()["estimate"]["profile"]["companions"]["shipped"] >= 1, refit.text
        graph = httpx.get(f"{server.url}/registries/shop/graph", timeout=30).json()
        edge = next(e for e in graph["learned"] if (e["first"], e["then"]) == PAIR)
        assert edge["callers"] == 3 and edge["active"] and edge["share"] == 1.0 and edge["uses"] >= 2
        why = f"learned companion of {PAIR[0]} (3 callers, {round(edge['uses'])} uses)"
        after = shortlist(server.url, explain=True)
        assert [t["name"] for t in after][: len(before)] == before
        assert (after[len(before)]["name"], after[len(before)]["reason"]) == (PAIR[1], why)
        step = shortlist(server.url, called=[PAIR[0]])
        assert (step[0]["name"], step[0]["reason"]) == (PAIR[1], f"next step after {PAIR[0]} (called): {why}")
        report = httpx.get(f"{server.url}/registries/shop/learning", timeout=30).json()
        assert report["companions"] >= 1 and report["companion_pairs"] >= 2
        server.stop(signal.SIGTERM)
        restarted = servers.start(explore_share="0")
        again = shortlist(restarted.url)
        assert (again[len(before)]["name"], again[len(before)]["reason"]) == (PAIR[1], why)
    finally:
        servers.close()


def test_a_learned_predecessor_becomes_the_prerequisite_shown_for_a_need(tmp_path: Path, minilm_cache: Path):
    """get_customer needs a ``customer_id`` that find_customer_by_email (the better-scored) and
    whoami both provide; once agents are seen calling whoami first, a refit makes whoami the
    prerequisite shown, for get_customer only (list_orders, with the same need, keeps its pick)."""
    from tests.server import Servers

    def prerequisite(url: str, query: str) -> list[tuple[str, str | None]]:
        tools = shortlist(url, query=query, explain=True)
        return [(t["name"], t["reason"]) for t in tools if (t["reason"] or "").startswith("prerequisite")]

    servers = Servers(tmp_path, minilm_cache)
    try:
        server = servers.start(explore_share="0")
        with ShortlistClient(server.url) as admin:
            admin.put_registry("shop", REST)
        record, orders = "show the customer's record", "list the customer's orders"
        need = "fills 'customer_id'"
        assert prerequisite(server.url, record) == [("find_customer_by_email", f"prerequisite of get_customer: {need}")]
        for i, who in enumerate(CITIES):  # sixteen requests from three agents: whoami, then get_customer
            headers = {"X-Caller-Id": f"agent-{i % 3}"}
            sl = httpx.post(f"{server.url}/shortlist", json={"registry": "shop", "query": f"the record of customer {who}"},
                            headers=headers, timeout=60)  # fmt: skip
            calls = [{"tool": "whoami", "useful": True}, {"tool": "get_customer", "useful": True}]
            fb = httpx.post(f"{server.url}/feedback", json={"shortlist_id": sl.json()["shortlist_id"], "calls": calls,
                            "used": ["whoami", "get_customer"], "success": True}, headers=headers, timeout=60)  # fmt: skip
            assert fb.status_code == 200, fb.text
        refit = httpx.post(f"{server.url}/registries/shop/policies/refit", json={}, timeout=120)
        assert refit.status_code == 200, refit.text
        learned = httpx.get(f"{server.url}/registries/shop/graph", timeout=30).json()["learned"]
        assert [(e["first"], e["then"], e["active"]) for e in learned] == [("whoami", "get_customer", True)]
        assert prerequisite(server.url, record) == [("whoami", f"prerequisite of get_customer: {need}")]
        assert prerequisite(server.url, orders) == [("find_customer_by_email", f"prerequisite of list_orders: {need}")]
    finally:
        servers.close()
