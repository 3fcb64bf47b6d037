"""Composing shortlists: folding near-duplicates, covering intents, pinning named tools;
and the engine doing it on a registry (hashing embedder)."""

from __future__ import annotations

import numpy as np
import pytest

from registry.feedback import EquivalenceClasses
from registry.request import ShortlistRequest
from registry.serving.compose import (
    INTENT_CONFIDENT_DEPTH,
    MAX_EXTRA_PER_INTENT,
    Folded,
    fold_duplicates,
    interleave,
)


def unit(*rows: list[float]) -> np.ndarray:
    m = np.array(rows, dtype=np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def folded(ids: list[int], scores: list[float] | None = None) -> Folded:
    s = scores or [1.0 - 0.1 * i for i in range(len(ids))]
    return Folded(np.array(ids, dtype=np.int64), np.array(s, dtype=np.float32))


def test_fold_duplicates_by_embedding_and_declared_equivalents():
    names = ["a", "a_copy", "b", "c", "c_alias"]
    emb = unit([1, 0, 0], [1, 0.01, 0], [0, 1, 0], [0, 0, 1], [0.3, 0.3, 1])
    ids = np.array([0, 1, 2, 3, 4])
    scores = np.array([0.9, 0.89, 0.5, 0.4, 0.3], dtype=np.float32)
    out = fold_duplicates(ids, scores, names, EquivalenceClasses([["c", "c_alias"]]), emb)
    assert out.ids.tolist() == [0, 2, 3]
    assert out.scores.tolist() == pytest.approx([0.9, 0.5, 0.4])
    assert out.alternates == {0: [1], 3: [4]}
    off = fold_duplicates(ids, scores, names, EquivalenceClasses(), emb, threshold=1.5)
    assert off.ids.tolist() == [0, 1, 2, 3, 4]


def test_interleave_covers_every_intent_before_second_best():
    main = folded([10, 11, 12, 13])
    first = folded([20, 21, 22])
    second = folded([30, 10, 31])
    picks = interleave(main, [(first, True), (second, True)], lambda s: 1, cap=20)
    assert [p.tool for p in picks] == [10, 20, 30]  # 1 + 1 + 1 slots
    assert [p.intent for p in picks] == [None, 0, 1]


def test_a_step_adds_its_own_tools_even_when_the_list_holds_its_best():
    main = folded([1, 2, 3])
    step = folded([7, 8, 9])
    picks = interleave(main, [(step, True)], lambda s: 2, cap=20)
    assert [p.tool for p in picks] == [1, 7, 2, 8]  # main's 2 + the step's 2
    assert MAX_EXTRA_PER_INTENT == 2
    assert len(interleave(main, [(step, True)], lambda s: 2, cap=3)) == 3
    overlapping = folded([2, 7, 8])  # its best is main's second: it still adds a tool of its own
    assert [p.tool for p in interleave(main, [(overlapping, True)], lambda s: 2, cap=20)] == [1, 2, 7]


def test_a_weaker_intent_adds_only_confident_prefixes_not_length():
    main = folded([1, 2, 3, 4, 5, 6])
    intent = folded([7, 8, 9, 10, 11])
    depths = {6: 4, 5: 2}  # by ranking length

    def choose(scores: np.ndarray) -> int:
        return depths[scores.size]

    picks = interleave(main, [(intent, False)], choose, cap=20)
    assert [p.tool for p in picks] == [1, 7, 2, 8, 3, 4]
    depths[5] = INTENT_CONFIDENT_DEPTH + 1  # no clear tool for it: it adds nothing
    assert [p.tool for p in interleave(main, [(intent, False)], choose, cap=20)] == [1, 2, 3, 4]
    covered = folded([2, 1, 9])
    assert [p.tool for p in interleave(folded([1, 2, 3]), [(covered, False)], lambda s: 2, cap=20)] == [1, 2]


def test_named_tools_lead_and_are_always_shown():
    main = folded([1, 2, 3])
    picks = interleave(main, [], lambda s: 1, cap=5, named=[(9, 0.2)])
    assert [(p.tool, p.named) for p in picks] == [(9, True), (1, False)]
    two = interleave(main, [], lambda s: 2, cap=5, named=[(3, 0.8), (9, 0.2)])
    assert [p.tool for p in two] == [3, 9, 1, 2]
    assert [p.tool for p in interleave(main, [], lambda s: 2, cap=2, named=[(3, 0.8), (9, 0.2)])] == [3, 9]
    assert [p.tool for p in interleave(main, [], lambda s: 3, cap=5, named=[(2, 0.9)])] == [2, 1, 3]


def test_interleave_lists_alternates_not_shown_elsewhere():
    main = Folded(np.array([1, 2]), np.array([0.9, 0.5], dtype=np.float32), {1: [5, 2]})
    picks = interleave(main, [], lambda s: 2, cap=5)
    assert [(p.tool, p.alternates) for p in picks] == [(1, (5,)), (2, ())]


# -- the engine ---------------------------------------------------------------------------------

TOOLS = [
    {"name": "slack_post_message", "description": "Post a message to a Slack channel"},
    {"name": "read_text_file", "description": "Read the contents of a text file from disk"},
    {"name": "get_weather", "description": "Current weather forecast for a city"},
    {"name": "yahoo.get_ticker_info", "description": "Stock quote and company info for a ticker"},
    {"name": "get_weather_copy", "description": "Current weather forecast for a city"},
    *({"name": f"filler_{i}", "description": f"unrelated helper number {i} for widgets"} for i in range(15)),
]


@pytest.fixture
def loaded(engine):
    engine.writer.put_registry("r", {"tools": TOOLS, "equivalents": [["get_weather", "get_weather_copy"]]})
    return engine


def names(result) -> list[str]:
    return [t.name for t in result.tools]


def test_engine_pins_a_named_tool_first(loaded):
    result = loaded.shortlist(ShortlistRequest("r", "run get_ticker_info for AAPL"))
    assert result.tools[0].name == "yahoo.get_ticker_info" and result.tools[0].named
    assert names(loaded.shortlist(ShortlistRequest("r", "get_ticker_info", k=1))) == ["yahoo.get_ticker_info"]


def test_engine_covers_two_intents(loaded):
    result = loaded.shortlist(ShortlistRequest("r", "read the text file notes.txt from disk, then post a message to the Slack channel"))
    assert {"read_text_file", "slack_post_message"} <= set(names(result))
    assert len(result.intents) == 2
    assert {t.intent for t in result.tools} >= {None}
    single = loaded.shortlist(ShortlistRequest("r", "post a message to the Slack channel"))
    assert single.intents == ()


def test_engine_folds_equivalent_tools_into_alternates(loaded):
    result = loaded.shortlist(ShortlistRequest("r", "current weather forecast for a city", max_k=5))
    shown = names(result)
    assert ("get_weather" in shown) != ("get_weather_copy" in shown)
    item = result.tools[0]
    assert item.name in {"get_weather", "get_weather_copy"}
    assert set(item.alternates) == {"get_weather", "get_weather_copy"} - {item.name}


def test_engine_never_shows_the_whole_registry_without_k(loaded):
    for bias in (-10.0, 0.0, 10.0):
        result = loaded.shortlist(ShortlistRequest("r", "widgets helper", depth_bias=bias, max_k=100))
        assert result.k <= len(TOOLS) // 2
    assert loaded.shortlist(ShortlistRequest("r", "widgets helper", k=len(TOOLS))).k == len(TOOLS)


def test_engine_accepts_long_messages(loaded):
    filler = " ".join(f"noise{i}" for i in range(20_000))
    result = loaded.shortlist(ShortlistRequest("r", f"{filler}\n\nread the text file from disk"))
    assert result.k >= 1 and "read_text_file" in names(result)


def test_engine_allow_empty(loaded):
    empty = loaded.shortlist(ShortlistRequest("r", "zzz qqq xxyy", allow_empty=True))
    assert empty.k == 0 and empty.tools == [] and empty.confidence is not None
    assert empty.confidence < loaded.queries.relevance.threshold
    assert empty.p_rand == 0.0 and empty.bor_max_bits == 0.0
    named = loaded.shortlist(ShortlistRequest("r", "zzz get_ticker_info", allow_empty=True))
    assert names(named)[:1] == ["yahoo.get_ticker_info"]  # a named tool always fits
    assert loaded.shortlist(ShortlistRequest("r", "zzz qqq xxyy")).k >= 1  # not asked: never empty
