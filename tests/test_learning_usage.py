"""Usage memory (registry.learning.usage): evidence, bounds, lift and gate, safety, persistence."""

from __future__ import annotations

import numpy as np
import pytest

from registry.feedback import ToolCall
from registry.index.embed import HashingEmbedder
from registry.learning.evidence import EvidenceConfig
from registry.learning.usage import UsageConfig, UsageMemory, tool_evidence
from tests.usage_events import event

EMBED = HashingEmbedder()


def memory(**config) -> UsageMemory:
    return UsageMemory(EMBED.embed_query, UsageConfig(**config))


def test_evidence_signs():
    assert tool_evidence(event("q", "a", "b")) == {"a": 1, "b": 1}
    assert tool_evidence(event("q", "a", success=False)) == {}
    calls = (ToolCall("a", True), ToolCall("a", False), ToolCall("b", False), ToolCall("c", True))
    assert tool_evidence(event("q", "a", "b", calls=calls)) == {"a": 1, "b": -1, "c": 1}
    # a useful call counts even when the task failed
    assert tool_evidence(event("q", "a", success=False, calls=(ToolCall("a", True),))) == {"a": 1}


def test_near_identical_queries_share_an_entry_and_count_up():
    m = memory()
    for _ in range(5):
        assert m.observe(event("weather in paris today", "get_weather")) == "counted"
    assert m.entries("r", "get_weather") == 1
    assert m.report("r")["events"] == 5


def test_bounded_per_tool_and_per_registry():
    m = memory(per_tool=8, per_registry=30)
    for i in range(40):
        m.observe(event(f"alpha{i} beta{i} gamma{i}", "tool_a"))
    assert m.entries("r", "tool_a") == 8
    for t in range(10):
        for i in range(6):
            m.observe(event(f"word{t}x{i} other{t}y{i}", f"tool_{t}"))
    assert m.entries("r") <= 30
    assert all(m.entries("r", f"tool_{t}") <= 8 for t in range(10))
    assert m.entries("r") == sum(m.entries("r", f"tool_{t}") for t in range(10)) + m.entries("r", "tool_a")


def test_lift_prefers_the_used_tool_and_never_reaches_past_the_candidates():
    m = memory(candidates=2, beta=0.5)
    for _ in range(10):
        m.observe(event("convert dollars to euros", "convert_currency"))
    q = EMBED.embed_query("convert dollars to euros please")
    base = np.array([0.9, 0.8, 0.1], np.float32)
    # convert_currency second: lifted above the first
    lifted = m.boost("r", q, ["send_email", "convert_currency", "x"], base)
    assert lifted[1] > lifted[0] and lifted[0] == pytest.approx(0.9)
    # third, past the 2 candidates: never lifted, however strong the evidence
    lifted = m.boost("r", q, ["send_email", "x", "convert_currency"], base)
    assert np.allclose(lifted, base)
    ids, scores = m.rerank("r", q, ["send_email", "convert_currency", "x"], np.array([7, 3, 5]), base)
    assert ids.tolist() == [3, 7, 5] and scores[0] > scores[1]


def test_an_unrelated_query_gets_no_lift():
    m = memory()
    for _ in range(10):
        m.observe(event("convert dollars to euros", "convert_currency"))
    q = EMBED.embed_query("read the file config yaml from disk")
    base = np.array([0.5, 0.4], np.float32)
    assert np.allclose(m.boost("r", q, ["read_file", "convert_currency"], base), base)


def test_useless_calls_temper_an_entry():
    m = memory()
    m.observe(event("book a flight to rome", "book_flight"))
    q = EMBED.embed_query("book a flight to rome")
    before = m.boost("r", q, ["book_flight"], np.zeros(1, np.float32))[0]
    m.observe(event("book a flight to rome", "book_flight", calls=(ToolCall("book_flight", False),)))
    after = m.boost("r", q, ["book_flight"], np.zeros(1, np.float32))[0]
    assert before > 0 and 0 <= after < before / 3  # the caller's repeat weighs 0.8: 1 - 0.8 is left


def test_duplicates_and_unknown_tools():
    m = memory()
    e = event("weather in paris", "get_weather")
    assert m.observe(e) == "counted"
    assert m.observe(e) == "duplicate"
    assert m.observe(event("weather in rome", "gone"), known_tools={"get_weather"}) == "no_evidence"
    assert m.observe(event("", "get_weather")) == "no_query"


def test_callers_need_a_token_when_required():
    m = memory(require_caller=True)
    assert m.observe(event("weather in paris", "get_weather")) == "untrusted"
    assert m.observe(event("weather in paris", "get_weather", caller="c1")) == "counted"
    assert m.report("r")["skipped"] == {"untrusted": 1}


def test_one_shared_token_never_locks_and_30_events_undo_10():
    """Issue 23 finding 2: with one token for every agent the old share cap skipped every event
    after the first 20 as "capped" (30 correcting events changed nothing)."""
    m = memory()
    q = "weather forecast for paris tomorrow"
    for i in range(10):  # an attacker under the shared token: the wrong tool for this need
        assert m.observe(event(f"{q} please {i}", "send_email", caller="shared", received=1000.0 + i)) == "counted"
    for i in range(30):  # legitimate agents, same token: the right one
        assert m.observe(event(f"{q} now {i}", "get_weather", caller="shared", received=1100.0 + i)) == "counted"
    assert m.report("r")["events"] == 40 and "capped" not in m.report("r")["skipped"]
    lift = m.boost("r", EMBED.embed_query(q), ["send_email", "get_weather"], np.zeros(2, np.float32))
    assert lift[1] > 1.5 * lift[0]  # decayed: 30 events weigh 9.02, the 10 wrong ones 5.39


def test_a_dominant_caller_weighs_less_but_still_counts():
    m = memory()
    for i in range(200):
        honest = i % 10 < 7  # 70% of events from 7 honest callers, 30% from one attacker
        caller = f"h{i % 10}" if honest else "attacker"
        assert m.observe(event(f"q{i} word{i}", f"t{i % 50}", caller=caller, received=1000.0 + i)) == "counted"
    counter = m._registries["r"].counter
    assert counter.weight["attacker"] / counter.total < 0.3 - 0.02  # soft share: scaled down
    assert counter.weight["attacker"] > 0


def test_a_caller_is_rate_limited_per_minute():
    from registry.learning.evidence import EvidenceConfig

    m = memory(evidence=EvidenceConfig(per_minute=30))
    outcomes = [m.observe(event(f"q{i}", f"t{i}", caller="c", received=1000.0 + i / 10)) for i in range(50)]
    assert outcomes.count("counted") == 30 and outcomes.count("rate_limited") == 20
    assert m.observe(event("later", "t1", caller="c", received=1100.0)) == "counted"  # next minute
    assert m.observe(event("other", "t2", caller="d", received=1000.0)) == "counted"  # other caller


def test_wipe_forgets_and_refuses_older_events():
    m = memory()
    m.observe(event("weather in paris", "get_weather", received=1000.0))
    m.wipe("r", at=2000.0)
    assert m.entries("r") == 0 and not m.has_memory("r")
    assert m.observe(event("weather in paris", "get_weather", received=1500.0)) == "stale"
    assert m.observe(event("weather in paris", "get_weather", received=2500.0)) == "counted"


def test_drop_tools():
    m = memory()
    m.observe(event("weather in paris", "get_weather"))
    m.observe(event("send an email to bob", "send_email"))
    assert m.drop_tools("r", keep={"send_email"}) == 1
    assert m.entries("r", "get_weather") == 0 and m.entries("r") == 1


def test_state_round_trip():
    m = memory(evidence=EvidenceConfig(caller_share=1.0))
    for i in range(20):
        m.observe(event(f"weather in city{i % 4}", "get_weather", caller=f"c{i % 3}", received=1000.0 + i))
    m.observe(event("send an email to bob", "send_email"))
    raw = m.state_bytes("r")
    assert raw is not None
    restored = memory(evidence=EvidenceConfig(caller_share=1.0))
    restored.load_state("r", raw)
    assert restored.report("r") == m.report("r")
    q = EMBED.embed_query("weather in city1")
    names = ["send_email", "get_weather"]
    base = np.zeros(2, np.float32)
    assert np.allclose(restored.boost("r", q, names, base), m.boost("r", q, names, base), atol=1e-3)
    # replaying the same events after a restore counts none of them twice
    assert restored.observe(event("x", "get_weather", received=100.0)) == "stale"
    with pytest.raises(ValueError):
        restored.load_state("r", b"not a state")
