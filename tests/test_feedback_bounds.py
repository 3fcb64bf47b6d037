"""Byte bounds on feedback (issue 23, item 6): the body (413), the calls and the stored event
(422 naming the field), and a compaction that starts on bytes as well as on events. Before, an
event with 10,000 calls added ~430 KB to the log and compaction waited for 200,000 events."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from registry.feedback import MAX_CALLS, MAX_CALLS_BYTES, LocalFeedbackLog, ShortlistMemory
from tests.feedback_helpers import clocked_recorder, submit_served

TOOLS = [{"name": "get_weather", "description": "Current weather for a city."},
         {"name": "send_email", "description": "Send an email to a recipient."}]


def served(client, registry: str = "r", **options) -> str:
    r = client.post("/shortlist", json={"registry": registry, "query": "weather in Paris", **options})
    assert r.status_code == 200, r.text
    return str(r.json()["shortlist_id"])


def logged(client) -> int:
    return int(client.app.state.service.core.feedback_recorder.log.pending_events())


def test_a_feedback_body_past_its_own_limit_is_413_and_records_nothing(make_client):
    with make_client() as client:
        client.put("/registries/r", json=TOOLS).raise_for_status()
        sid = served(client)
        calls = [{"tool": "get_weather", "useful": True}] * 5_000  # within MAX_CALLS, ~170 KB
        assert len(calls) <= MAX_CALLS
        r = client.post("/feedback", json={"shortlist_id": sid, "used": ["get_weather"], "calls": calls})
        assert r.status_code == 413, r.text
        error = r.json()["error"]
        assert error["type"] == "payload_too_large" and error["details"]["field"] == "body"
        assert "SHORTLIST_MAX_FEEDBACK_BODY_BYTES" in error["message"]
        assert error["details"]["limit_bytes"] == 128 * 1024
        assert logged(client) == 0
        ok = client.post("/feedback", json={"shortlist_id": sid, "used": ["get_weather"], "calls": calls[:10]})
        assert ok.status_code == 200 and not ok.json()["duplicate"]  # the id was not used up
        # registry uploads keep the general limit (SHORTLIST_MAX_BODY_BYTES)
        big = [{"name": f"t{i}", "description": "x" * 1000} for i in range(200)]  # ~220 KB
        assert client.put("/registries/big", json=big).status_code == 200


def test_calls_past_their_byte_bound_are_422_naming_calls(make_client):
    with make_client() as client:
        client.put("/registries/r", json=TOOLS).raise_for_status()
        sid = served(client)
        calls = [{"tool": "get_weather", "useful": i % 2 == 0} for i in range(2_500)]  # ~90 KB stored
        r = client.post("/feedback", json={"shortlist_id": sid, "used": ["get_weather"], "calls": calls})
        assert r.status_code == 422, r.text
        (problem,) = r.json()["error"]["details"]
        assert problem["field"] == "calls" and str(MAX_CALLS_BYTES) in problem["message"]
        assert logged(client) == 0
        fits = calls[:1_500]  # ~54 KB: within the bound
        assert client.post("/feedback", json={"shortlist_id": sid, "used": ["get_weather"], "calls": fits}).status_code == 200
        assert logged(client) == 1


def test_a_stored_event_past_its_limit_is_422_naming_its_largest_fields(make_client):
    tools = [{"name": f"tool_{i:03d}_" + "n" * 200, "description": f"tool number {i}"} for i in range(40)]
    with make_client(max_feedback_event_bytes=8192) as client:
        client.put("/registries/long", json=tools).raise_for_status()
        sid = served(client, "long", k=30)  # 30 shown names of ~210 characters, plus the tail
        used = [tools[0]["name"]]
        r = client.post("/feedback", json={"shortlist_id": sid, "used": used})
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert "SHORTLIST_MAX_FEEDBACK_EVENT_BYTES" in error["message"] and "8192" in error["message"]
        assert error["details"][0]["field"] in ("shown", "ranking")
        assert {d["field"] for d in error["details"]} >= {"shown"}
        assert logged(client) == 0
        short = served(client, "long", k=2)
        assert client.post("/feedback", json={"shortlist_id": short, "used": used}).status_code == 200


def _large_events_then_a_late_one(tmp_path: Path, compact_after_bytes: int) -> tuple[int, int, int]:
    """(events kept while young, events kept at the end, events counted)."""
    now = [100_000.0]
    log = LocalFeedbackLog.in_data_dir(tmp_path)
    rec = clocked_recorder(ShortlistMemory(10**9), log, lambda: now[0], compact_after_events=10**6,
                           compact_after_bytes=compact_after_bytes, compact_margin_seconds=60,
                           min_compact_interval_seconds=0)
    for i in range(8):  # 8 large events (~50 KB each), far below the event threshold
        now[0] = 100_000.0 + 60 * i
        submit_served(rec, f"s{i}", calls=1_400)
    young = log.pending_events()
    assert log.pending_bytes() > 200_000
    now[0] += 3 * 3600
    submit_served(rec, "late", calls=1)
    for _ in range(40):
        if log.pending_events() == 1:
            break
        rec.maybe_compact()
        time.sleep(0.05)
    kept = log.pending_events()
    counted = int(rec.efficiency.report("r")["events"])
    rec.close()  # joins a compaction still running (it would log after the test)
    log.close()
    return young, kept, counted


def test_compaction_starts_on_bytes_as_well_as_events(tmp_path: Path) -> None:
    young, kept, counted = _large_events_then_a_late_one(tmp_path / "bytes", 200_000)
    assert young == 8  # too young to fold, whatever the size
    assert kept == 1 and counted == 9  # folded once old enough; their counts stay
    assert LocalFeedbackLog.in_data_dir(tmp_path / "bytes").pending_bytes() < 2_000
    # the same events under a byte threshold never reached: nothing is compacted
    assert _large_events_then_a_late_one(tmp_path / "events", 10**12)[1:] == (9, 9)


def test_the_redis_stream_reports_its_bytes(redis_server, redis_prefix) -> None:
    from registry.store.redis import RedisFeedbackLog, RedisShortlistMemory, connect

    client = connect(redis_server.url)
    log = RedisFeedbackLog(client, redis_prefix)
    rec = clocked_recorder(RedisShortlistMemory(client, 600, redis_prefix), log, time.time,
                           compact_after_events=10**6, compact_after_bytes=100_000,
                           min_compact_interval_seconds=0)
    submit_served(rec, "small", calls=1)
    small = log.pending_bytes()
    for i in range(4):
        submit_served(rec, f"big{i}", calls=1_400)
    assert log.pending_events() == 5
    assert log.pending_bytes() > small + 4 * 40_000 > 100_000
    rec.close()
    assert rec.compactions >= 1  # the byte threshold started one (nothing old enough to fold)


def test_the_calls_bound_is_bytes_not_a_count():
    from registry.errors import ValidationFailed
    from registry.feedback import parse_feedback

    short = [{"tool": "t", "useful": True}] * 2_000  # 2,000 calls, ~52 KB stored
    assert len(parse_feedback(["t"], short)[1]) == 2_000
    long_name = "x" * 200  # 225 bytes a call stored
    assert len(parse_feedback(["t"], [{"tool": long_name, "useful": True}] * 250)[1]) == 250
    with pytest.raises(ValidationFailed) as err:
        parse_feedback(["t"], [{"tool": long_name, "useful": True}] * 300)  # ~67 KB
    assert err.value.details[0]["field"] == "calls"
