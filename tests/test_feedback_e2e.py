"""A simulated agent against the real server: feedback, equivalents, counters, gauges, report.

Every expected number is computed here, independently of the service (P_rand with scipy).
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections import defaultdict

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from scipy.stats import hypergeom

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

EQUIVALENTS = [["get_weather", "get_weather_forecast"], ["send_email", "slack.post_message"]]
CLASS = {name: set(group) for group in EQUIVALENTS for name in group}

# (query, the tool the agent ends up using)
EPISODES = [
    ("What's the weather like in Paris right now?", "get_weather"),
    ("will it rain in Berlin over the next five days", "get_weather_forecast"),
    ("is it sunny in Rome today", "get_weather_forecast"),  # the agent used the other equivalent
    ("convert 100 dollars to euros", "convert_currency"),
    ("email the quarterly report to bob@example.com", "send_email"),
    ("let the team know in the #general channel that we shipped", "send_email"),
    ("book me a flight from JFK to LAX next friday", "book_flight"),
    ("read the contents of the file config.yaml", "filesystem/read_file"),
    ("what is 10 factorial", "math.factorial"),
    ("open a GitHub issue about the login crash", "github.create_issue"),
    ("translate 'good morning' into German", "translate_text"),
    ("remind me to call mum at 6pm", "set_reminder"),
]


def p_rand(n: int, r: int, k: int) -> float:
    return float(hypergeom(n, min(r, n), k).sf(0))


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_simulated_agent_feedback_loop(server_factory):
    server = server_factory(prune_min_calls="2", prune_min_shown="3")
    tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())["tools"]
    put = httpx.put(f"{server.url}/registries/agent", json={"tools": tools, "equivalents": EQUIVALENTS})
    assert put.status_code == 200, put.text
    assert httpx.get(f"{server.url}/registries/agent").json()["equivalents"] == sorted(
        sorted(g) for g in EQUIVALENTS
    )
    names = [t.get("name") or t["function"]["name"] for t in tools]
    n = len(names)

    events = []  # what we sent and what we expect to be counted
    shown_count, used_count = defaultdict(int), defaultdict(int)
    useful, useless = defaultdict(int), defaultdict(int)
    trajectories = []
    for i, (query, used) in enumerate(EPISODES):
        sl = httpx.post(f"{server.url}/shortlist", json={"registry": "agent", "query": query}).json()
        shown = [t["name"] for t in sl["tools"]]
        k = sl["k"]
        # The agent first tries the top-ranked tool when it is not the one it needs (a useless
        # call), then calls the tool it needs (useful); every third episode reports no calls.
        calls = []
        if i % 3 != 2:
            if shown and shown[0] != used:
                calls.append({"tool": shown[0], "useful": False})
            calls.append({"tool": used, "useful": True})
        body = {"shortlist_id": sl["shortlist_id"], "used": [used], "success": True}
        if calls:
            body["calls"] = calls
        r = httpx.post(f"{server.url}/feedback", json=body)
        assert r.status_code == 200, r.text
        got = r.json()
        exact = used in shown
        equivalent = bool(CLASS.get(used, {used}) & set(shown))
        assert got["duplicate"] is False
        assert got["presented"] == {"exact": exact, "equivalent": equivalent}
        assert got["p_rand"]["exact"] == pytest.approx(p_rand(n, 1, k))
        assert got["p_rand"]["equivalent"] == pytest.approx(p_rand(n, len(CLASS.get(used, {used})), k))
        events.append((exact, equivalent, p_rand(n, 1, k), p_rand(n, len(CLASS.get(used, {used})), k)))
        for name in shown:
            shown_count[name] += 1
        used_count[used] += 1
        for call in calls:
            (useful if call["useful"] else useless)[call["tool"]] += 1
        if calls:
            trajectories.append(sum(c["useful"] for c in calls) / len(calls))
        if i % 4 == 0:  # resends are acknowledged but never counted twice
            again = httpx.post(f"{server.url}/feedback", json=body)
            assert again.status_code == 200 and again.json()["duplicate"] is True

    # Bad feedback: unknown shortlist -> 404, unknown tool -> 422 naming it; nothing counted.
    missing = httpx.post(f"{server.url}/feedback", json={"shortlist_id": "nope", "used": ["get_weather"]})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
    sl = httpx.post(f"{server.url}/shortlist", json={"registry": "agent", "query": "weather"}).json()
    bad = httpx.post(f"{server.url}/feedback", json={"shortlist_id": sl["shortlist_id"], "used": ["no_such_tool"]})
    assert bad.status_code == 422 and "no_such_tool" in bad.text

    metrics = scrape(server.url)
    total = len(events)
    assert metrics[("shortlist_feedback_total", (("registry", "agent"),))] == total
    for idx, match in ((0, "exact"), (1, "equivalent")):
        labels = (("match", match), ("registry", "agent"))
        presented = sum(e[idx] for e in events)
        p_sum = sum(e[idx + 2] for e in events)
        assert metrics[("shortlist_presented_total", labels)] == presented
        assert metrics[("shortlist_feedback_p_rand_sum", labels)] == pytest.approx(p_sum)
        assert metrics[("shortlist_presentation_rate", labels)] == pytest.approx(presented / total)
        assert metrics[("shortlist_live_bor_bits", labels)] == pytest.approx(
            math.log2((presented / total) / (p_sum / total))
        )
    assert metrics[("shortlist_presented_total", (("match", "equivalent"), ("registry", "agent")))] >= \
        metrics[("shortlist_presented_total", (("match", "exact"), ("registry", "agent")))]

    def expected_report():
        rows = []
        for name in sorted(names):
            calls = useful[name] + useless[name]
            rows.append({
                "name": name, "shown": shown_count[name], "used": used_count[name],
                "useful_calls": useful[name], "useless_calls": useless[name],
                "aggregate_utility": useful[name] - useless[name],
                "efficiency": useful[name] / calls if calls else None,
            })
        prune = sorted(
            r["name"] for r in rows
            if (r["useful_calls"] + r["useless_calls"] >= 2 and r["aggregate_utility"] <= 0)
            or (r["shown"] >= 3 and r["used"] == 0)
        )
        return rows, prune

    rows, prune = expected_report()
    report = httpx.get(f"{server.url}/registries/agent/report").json()
    assert report["registry"] == "agent" and report["events"] == total
    assert report["tools"] == rows
    assert report["prune_candidates"] == prune
    assert report["mean_trajectory_efficiency"] == pytest.approx(sum(trajectories) / len(trajectories))

    # The feedback log is durable: a crashed and restarted server reports the same numbers.
    server.stop(signal.SIGKILL)
    again = server_factory(prune_min_calls="2", prune_min_shown="3")
    # the usage learner folds the log's tail in the background after a start: its event count
    # catches up within moments, everything else is equal at once
    for _ in range(100):
        restarted = httpx.get(f"{again.url}/registries/agent/report").json()
        if restarted == report:
            break
        assert {k: v for k, v in restarted.items() if k != "learning"} == {
            k: v for k, v in report.items() if k != "learning"
        }
        time.sleep(0.1)
    assert restarted == report
    restored = scrape(again.url)
    rate_labels = (("match", "exact"), ("registry", "agent"))
    assert restored[("shortlist_presentation_rate", rate_labels)] == pytest.approx(
        sum(e[0] for e in events) / total
    )
    log = (server.log_path.parent / "data" / "feedback" / "events.jsonl").read_text().splitlines()
    assert len(log) == total


def test_feedback_log_compaction_survives_sigkill(server_factory, tmp_path):
    """A real server compacts its feedback log (tiny thresholds), is SIGKILLed, and the restarted
    server reports exactly the same tool efficiency from checkpoint + remaining log."""
    import time

    settings = dict(feedback_compact_events="4", feedback_compact_interval_seconds="0",
                    feedback_compact_margin_seconds="0", live_window_seconds="1")
    server = server_factory(**settings)
    tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())["tools"]
    httpx.put(f"{server.url}/registries/agent", json={"tools": tools}).raise_for_status()
    for i, (query, used) in enumerate(EPISODES):
        sid = httpx.post(f"{server.url}/shortlist", json={"registry": "agent", "query": query}).json()
        body = {"shortlist_id": sid["shortlist_id"], "used": [used],
                "calls": [{"tool": used, "useful": i % 3 != 0}]}
        httpx.post(f"{server.url}/feedback", json=body).raise_for_status()
        if i == 5:
            time.sleep(1.2)  # the first six leave the 1 s live window: compactable
    checkpoint = server.data_dir / "feedback" / "checkpoint.json"
    for _ in range(100):
        if checkpoint.exists():
            break
        time.sleep(0.05)
    assert checkpoint.exists()
    before = httpx.get(f"{server.url}/registries/agent/report").json()
    assert before["events"] == 12
    server.stop(signal.SIGKILL)  # possibly in the middle of another compaction
    again = server_factory(**{**settings, "feedback_compact_events": "1000000"})  # no more compactions
    assert httpx.get(f"{again.url}/registries/agent/report").json() == before
    folded = json.loads(checkpoint.read_text())["events_folded"]
    lines = (server.data_dir / "feedback" / "events.jsonl").read_bytes().splitlines()
    assert 6 <= folded <= 12
    if json.loads(lines[0]).keys() == {"log_generation"}:  # the rewrite landed before the kill
        assert len(lines) - 1 == 12 - folded
    archived = server.data_dir / "feedback" / "archive"
    assert any(archived.glob("*.jsonl.gz"))
