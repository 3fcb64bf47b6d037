"""Usage memory through the app (fake embedder): feedback lifts a tool; switch, wipe, deletion,
restart, token gating and the caller cap."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from registry.feedback import FeedbackRequest
from registry.request import ShortlistRequest
from tests.cores import new_core

TOOLS = [
    {"name": "get_weather", "description": "Current weather conditions in a city"},
    {"name": "weather_forecast", "description": "Weather forecast for the coming days"},
    {"name": "send_email", "description": "Send an email message"},
    {"name": "convert_currency", "description": "Convert money between currencies"},
]
LIFT = {"learning_beta": 1.0, "learning_similarity": 0.5}  # the fake embedder: far-apart scores, lower cosines
CITIES = ["paris", "rome", "berlin", "madrid", "lisbon", "vienna", "prague", "oslo", "dublin", "athens"]


def rank_of(client, query: str, tool: str, headers=None) -> int:
    body = client.post("/shortlist", json={"registry": "w", "query": query, "k": 4}, headers=headers).json()
    return [t["name"] for t in body["tools"]].index(tool)


def teach(client, n: int, headers=None) -> None:
    """An agent that asks about the weather and uses the forecast tool."""
    for i in range(n):
        query = f"weather today in {CITIES[i % len(CITIES)]} city"
        body = client.post("/shortlist", json={"registry": "w", "query": query, "k": 4}, headers=headers).json()
        r = client.post("/feedback", json={"shortlist_id": body["shortlist_id"], "used": ["weather_forecast"],
                                          "success": True}, headers=headers)
        assert r.status_code == 200, r.text


def test_feedback_lifts_the_used_tool_and_the_report_shows_it(make_client):
    with make_client(**LIFT) as client:
        assert client.put("/registries/w", json=TOOLS).status_code == 200
        query = "weather today in london city"
        assert rank_of(client, query, "weather_forecast") > 0  # get_weather matches 'today' too
        teach(client, 10)
        assert rank_of(client, query, "weather_forecast") == 0
        # an unrelated query is not touched
        assert rank_of(client, "convert money to euros", "convert_currency") == 0
        learning = client.get("/registries/w/report").json()["learning"]
        assert learning["events"] == 10 and learning["tools_with_memory"] == 1
        assert learning["enabled"] and learning["caller_shares"][0]["caller"] is None
        assert client.get("/registries/w/learning").json() == learning


def test_switch_off_wipe_and_deletion(make_client, settings):
    query = "weather today in london city"
    with make_client(**LIFT) as client:
        client.put("/registries/w", json=TOOLS)
        teach(client, 10)
        assert rank_of(client, query, "weather_forecast") == 0
        off = client.put("/registries/w/learning", json={"enabled": False})
        assert off.status_code == 200 and off.json()["enabled"] is False
        assert rank_of(client, query, "weather_forecast") > 0  # no lift while off
        teach(client, 3)
        assert client.get("/registries/w/learning").json()["events"] == 10  # nothing folded
        client.put("/registries/w/learning", json={"enabled": True})
        assert rank_of(client, query, "weather_forecast") == 0  # memory kept
        wiped = client.delete("/registries/w/learning").json()
        assert wiped["events"] == 0 and wiped["entries"] == 0 and wiped["wiped_at"] > 0
        assert rank_of(client, query, "weather_forecast") > 0
        # deleting the tool deletes its memory
        teach(client, 5)
        assert client.delete("/registries/w/tools/weather_forecast").status_code == 204
        assert client.get("/registries/w/learning").json()["entries"] == 0
        assert client.get("/registries/nope/learning").status_code == 404
        assert client.put("/registries/w/learning", json={"enabled": "no"}).status_code == 422


def test_memory_survives_a_restart_and_dies_with_its_registry(make_client, settings):
    query = "weather today in london city"
    with make_client(**LIFT) as client:
        client.put("/registries/w", json=TOOLS)
        teach(client, 10)
    state = Path(settings.data_dir) / "learning" / "w.usage.npz"
    assert state.exists()
    with make_client(**LIFT) as client:
        assert client.get("/registries/w/learning").json()["events"] == 10
        assert rank_of(client, query, "weather_forecast") == 0
        assert client.delete("/registries/w").status_code == 204
        assert not state.exists()
        client.put("/registries/w", json=TOOLS)  # a new registry of that name starts afresh
        assert client.get("/registries/w/learning").json()["entries"] == 0
        assert rank_of(client, query, "weather_forecast") > 0
    with make_client(**LIFT) as client:  # and the old events in the feedback log stay forgotten
        assert client.get("/registries/w/learning").json()["entries"] == 0


def test_global_switch(make_client):
    with make_client(learning=False, **LIFT) as client:
        client.put("/registries/w", json=TOOLS)
        teach(client, 10)
        learning = client.get("/registries/w/learning").json()
        assert learning["enabled"] is False and learning["events"] == 0
        assert rank_of(client, "weather today in london city", "weather_forecast") > 0


def test_with_tokens_only_callers_count_and_a_dominant_one_weighs_less(make_client, settings, bor_policy):
    tokens = tuple(SecretStr(f"token-{i}-0123456789abcdef") for i in range(6))
    with make_client(query_token=tokens, learning_caller_share=0.3, **LIFT) as client:
        client.put("/registries/w", json=TOOLS)
        for i in range(6):
            teach(client, 4 if i else 40, headers={"Authorization": f"Bearer token-{i}-0123456789abcdef"})
        learning = client.get("/registries/w/learning", headers={"Authorization": "Bearer token-1-0123456789abcdef"}).json()
        top = learning["caller_shares"][0]
        assert top["caller"] is not None and top["events"] == 40  # every event counts (no lock) ...
        assert learning["events"] == 60 and "capped" not in learning["skipped"]
        assert learning["profiles"][0]["tool"] == "weather_forecast"
        # ... but its repeats decay: 40 claims of one tool weigh ~11, not 40
        assert learning["profiles"][0]["evidence"] < 0.5 * 60
    # the core called in-process without a caller: not counted while query tokens are set
    core = new_core(settings, bor_policy=bor_policy, query_token=tokens)
    try:
        result = core.shortlist(ShortlistRequest("w", "weather today in oslo city", k=2))
        core.feedback(FeedbackRequest(result.shortlist_id, ["weather_forecast"]))
        assert core.learning_report("w")["skipped"]["untrusted"] == 1
    finally:
        core.close()


def test_one_shared_token_with_caller_ids_counts_agents_apart(make_client):
    """Issue 23 finding 2: one token for every agent made them one caller; X-Caller-Id (hashed
    under the token) tells them apart for the decay, and a different token cannot claim the same
    id. The shares are per token (issue 35 finding 3)."""
    token = SecretStr("shared-token-0123456789abcdef")
    other = SecretStr("other-token-0123456789abcdef")
    with make_client(query_token=(token, other), **LIFT) as client:
        client.put("/registries/w", json=TOOLS)
        auth = {"Authorization": f"Bearer {token.get_secret_value()}"}
        for agent in ("alice", "bob", "carol"):
            teach(client, 3, headers={**auth, "X-Caller-Id": agent})
        teach(client, 3, headers={"Authorization": f"Bearer {other.get_secret_value()}", "X-Caller-Id": "alice"})
        learning = client.get("/registries/w/learning", headers=auth).json()
        callers = [c["caller"] for c in learning["caller_shares"]]
        assert len(callers) == len(set(callers)) == 2 and all(c is not None for c in callers)
        assert [c["events"] for c in learning["caller_shares"]] == [9, 3]
        # three agents each repeating one claim 3 times: 3 x (1 + 0.8 + 0.667), not 9 decayed repeats
        evidence = learning["profiles"][0]["evidence"]
        assert evidence > 3 * 2.4


def test_rotating_caller_ids_do_not_escape_the_per_token_rate(make_client):
    """Issue 35 finding 3: one token sending each event under a new X-Caller-Id escaped the
    per-minute rate and the share (each id counted as a new caller)."""
    token = "rotating-token-0123456789abcdef"
    with make_client(query_token=(SecretStr(token),), learning_caller_events_per_minute=5, **LIFT) as client:
        client.put("/registries/w", json=TOOLS)
        auth = {"Authorization": f"Bearer {token}"}
        for i in range(12):
            teach(client, 1, headers={**auth, "X-Caller-Id": f"agent-{i}"})
        learning = client.get("/registries/w/learning", headers=auth).json()
    assert learning["skipped"].get("rate_limited") == 7 and learning["events"] == 5
    assert len(learning["caller_shares"]) == 1 and learning["caller_shares"][0]["events"] == 5


def test_caller_hashes_are_keyed_by_a_kept_secret(make_client, settings):
    """Issue 35 finding 8: caller_shares held 16 hex of an unsalted SHA-256 of each token, so a
    query token holder could brute-force weak tokens offline. Hashes are now HMACs under a key
    made once and kept in the data dir (0600): stable across restarts, unknown to callers."""
    import hashlib

    token = "weak-token-0123456789abcdef"
    auth = {"Authorization": f"Bearer {token}"}
    shares = []
    for _ in range(2):  # a restart keeps the key, so the same token keeps its hash
        with make_client(query_token=(SecretStr(token),), **LIFT) as client:
            if not shares:
                client.put("/registries/w", json=TOOLS)
                teach(client, 2, headers=auth)
            shares.append(client.get("/registries/w/learning", headers=auth).json()["caller_shares"][0]["caller"])
    unsalted = hashlib.sha256(b"tool-shortlist caller\0" + token.encode()).hexdigest()[:16]
    assert shares[0] == shares[1] and shares[0] != unsalted and len(shares[0]) == 16
    key_file = settings.data_dir / "caller.key"
    assert key_file.stat().st_mode & 0o077 == 0 and len(key_file.read_bytes()) == 32
    with make_client(query_token=(SecretStr(token),), caller_key=SecretStr("operator-set-key"), **LIFT) as client:
        client.put("/registries/k", json=TOOLS)
        body = client.post("/shortlist", json={"registry": "k", "query": "weather", "k": 2}, headers=auth).json()
        remembered = client.app.state.service.core.feedback_recorder.memory.get(body["shortlist_id"])
    assert remembered.caller not in (None, shares[0], unsalted)
