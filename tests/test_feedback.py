"""Feedback: equivalence classes, event scoring and the shortlist memory. Fast and self-contained."""

from __future__ import annotations

import json
import math
import threading

import pytest
from scipy.stats import hypergeom

from registry.errors import NotFound, ShortlistNotFound, ValidationFailed
from registry.feedback import (
    EquivalenceClasses,
    FeedbackEvent,
    ShortlistMemory,
    ToolCall,
    build_event,
    parse_feedback,
    validate_equivalents,
)
from tests.feedback_helpers import TOOLS, FakeClock, shortlist


def scipy_p_rand(n: int, r: int, k: int) -> float:
    return float(1.0 - hypergeom(n, r, k).pmf(0))


def problem_fields(exc: pytest.ExceptionInfo[ValidationFailed]) -> list[str]:
    return [p["field"] for p in exc.value.details]


# -- equivalence classes ----------------------------------------------------------------------


def test_equivalence_classes_merge_transitively() -> None:
    eq = EquivalenceClasses([["c", "b"], ["d", "e"], ["b", "a"], ["x", "x"]])
    assert eq.groups == (("a", "b", "c"), ("d", "e"))
    assert eq.class_of("a") == frozenset({"a", "b", "c"})
    assert eq.class_of("e") == frozenset({"d", "e"})
    assert eq.class_of("zzz") == frozenset({"zzz"})
    assert eq.class_of("x") == frozenset({"x"})  # a one-name group is no equivalence
    assert eq.expand(["a", "q"]) == frozenset({"a", "b", "c", "q"})
    assert eq.expand([]) == frozenset()
    # A chain given out of order still collapses into one class.
    chain = EquivalenceClasses([["p4", "p5"], ["p1", "p2"], ["p3", "p4"], ["p2", "p3"]])
    assert chain.groups == (("p1", "p2", "p3", "p4", "p5"),)
    assert EquivalenceClasses([]).groups == ()


def test_validate_equivalents_normalises() -> None:
    known = {"a", "b", "c", "d", "e"}
    assert validate_equivalents([["c", "b"], ["a", "b", "b"], ["e", "d"]], known) == [
        ["a", "b", "c"],
        ["d", "e"],
    ]
    assert validate_equivalents([], known) == []
    assert validate_equivalents(None, known) == []


def test_validate_equivalents_lists_every_problem() -> None:
    known = {"a", "b", "c"}
    with pytest.raises(ValidationFailed) as exc:
        validate_equivalents([["a", "nope"], "a", ["b"], ["a", 7, "c"], ["c", "c"]], known)
    details = exc.value.details
    assert problem_fields(exc) == [
        "equivalents[0][1]",
        "equivalents[1]",
        "equivalents[2]",
        "equivalents[3][1]",
        "equivalents[4]",
    ]
    assert details[0]["tool"] == "nope"
    assert all(isinstance(p["message"], str) and p["message"] for p in details)
    with pytest.raises(ValidationFailed) as exc:
        validate_equivalents({"a": "b"}, known)
    assert problem_fields(exc) == ["equivalents"]


# -- events -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "shown", "used", "groups"),
    [
        (20, ["t0", "t1", "t2"], ["t5"], []),
        (20, ["t0", "t1", "t2"], ["t0", "t7"], []),
        (20, ["t0"], ["t3"], [["t3", "t4", "t5"]]),
        (20, [f"t{i}" for i in range(10)], ["t11", "t12"], [["t11", "t13"], ["t12", "t14", "t15"]]),
        (7, ["t0", "t1"], ["t2"], [["t2", "t3", "t4", "t5", "t6"]]),
        (20, ["t0", "t1", "t2", "t3", "t4"], ["t9"], [[f"t{i}" for i in range(9, 20)]]),
    ],
)
def test_build_event_p_rand_matches_hypergeom(
    n: int, shown: list[str], used: list[str], groups: list[list[str]]
) -> None:
    eq = EquivalenceClasses(groups)
    event = build_event(
        shortlist(shown=shown, n_tools=n), used, [], None, TOOLS[:n], eq, received=5.0
    )
    k = len(shown)
    r_equiv = len(eq.expand(used))
    assert math.isclose(event.p_rand_exact, scipy_p_rand(n, len(set(used)), k), rel_tol=1e-9)
    assert math.isclose(event.p_rand_equivalent, scipy_p_rand(n, r_equiv, k), rel_tol=1e-9)
    assert event.p_rand_equivalent >= event.p_rand_exact
    assert event.received == 5.0


def test_build_event_presented_exact_vs_equivalent() -> None:
    eq = EquivalenceClasses([["t1", "t9"]])
    sl = shortlist(shown=["t0", "t1", "t2"])
    exact = build_event(sl, ["t1"], [], True, TOOLS, eq, 0.0)
    assert (exact.presented_exact, exact.presented_equivalent) == (True, True)
    equiv = build_event(sl, ["t9"], [], True, TOOLS, eq, 0.0)
    assert (equiv.presented_exact, equiv.presented_equivalent) == (False, True)
    # R for the equivalent match is the class size: {t1, t9}
    assert math.isclose(equiv.p_rand_equivalent, scipy_p_rand(20, 2, 3), rel_tol=1e-9)
    assert math.isclose(equiv.p_rand_exact, scipy_p_rand(20, 1, 3), rel_tol=1e-9)
    miss = build_event(sl, ["t5", "t6"], [], False, TOOLS, eq, 0.0)
    assert (miss.presented_exact, miss.presented_equivalent) == (False, False)


def test_build_event_collapses_duplicates_and_keeps_calls() -> None:
    calls = [{"tool": "t0", "useful": True}, ToolCall("t3", False)]
    event = build_event(
        shortlist(), ["t3", "t0", "t3"], calls, None, TOOLS, EquivalenceClasses(), 1.0
    )
    assert event.used == ("t3", "t0")
    assert event.calls == (ToolCall("t0", True), ToolCall("t3", False))
    assert math.isclose(event.p_rand_exact, scipy_p_rand(20, 2, 3), rel_tol=1e-9)


def test_build_event_clips_equivalent_r_to_n() -> None:
    # The class lists more names than the registry held when the shortlist was served.
    eq = EquivalenceClasses([TOOLS])
    event = build_event(shortlist(n_tools=5, shown=["t0"]), ["t3"], [], None, TOOLS, eq, 0.0)
    assert event.p_rand_equivalent == 1.0


def test_build_event_accepts_a_shown_tool_deleted_since() -> None:
    sl = shortlist(shown=["gone", "t1"])
    event = build_event(sl, ["gone"], [], None, TOOLS, EquivalenceClasses(), 0.0)
    assert event.presented_exact


def test_build_event_validation_lists_every_problem() -> None:
    sl = shortlist()
    eq = EquivalenceClasses()
    with pytest.raises(ValidationFailed) as exc:
        build_event(
            sl,
            ["t0", 3, "missing"],
            [{"tool": "t1", "useful": True}, {"tool": "ghost", "useful": False}, {"tool": "t2"}, 5],
            "yes",
            TOOLS,
            eq,
            0.0,
        )
    assert problem_fields(exc) == [
        "used[1]",
        "calls[2].useful",
        "calls[3]",
        "success",
        "used[2]",
        "calls[1].tool",
    ]
    by_field = {p["field"]: p for p in exc.value.details}
    assert by_field["used[2]"]["tool"] == "missing"
    assert "missing" in by_field["used[2]"]["message"]
    assert by_field["calls[1].tool"]["tool"] == "ghost"

    bad: object
    for bad in (None, [], "t0", {"t0": 1}):
        with pytest.raises(ValidationFailed) as exc:
            build_event(sl, bad, None, None, TOOLS, eq, 0.0)
        assert problem_fields(exc) == ["used"]
    with pytest.raises(ValidationFailed) as exc:
        build_event(sl, ["t0"], {"tool": "t0"}, None, TOOLS, eq, 0.0)
    assert problem_fields(exc) == ["calls"]


def test_parse_feedback_structure_only() -> None:
    used, calls, success = parse_feedback(["b", "a", "b"], [{"tool": "x", "useful": False}], True)
    assert used == ("b", "a")
    assert calls == (ToolCall("x", False),)
    assert success is True
    with pytest.raises(ValidationFailed) as exc:
        parse_feedback(["a", ""], [{"tool": "", "useful": 1}])
    assert problem_fields(exc) == ["used[1]", "calls[0].tool", "calls[0].useful"]


def test_event_json_roundtrip() -> None:
    event = build_event(
        shortlist(),
        ["t1", "t7"],
        [{"tool": "t1", "useful": True}],
        False,
        TOOLS,
        EquivalenceClasses([["t7", "t2"]]),
        123.5,
    )
    data = json.loads(json.dumps(event.to_json()))
    assert FeedbackEvent.from_json(data) == event


# -- shortlist memory -------------------------------------------------------------------------


def test_memory_ttl_with_fake_clock() -> None:
    clock = FakeClock(100.0)
    memory = ShortlistMemory(retention_seconds=60, clock=clock)
    memory.remember(shortlist("a", created=100.0))
    clock.advance(30)
    memory.remember(shortlist("b", created=130.0))
    assert memory.get("a") is not None and memory.get("b") is not None
    assert memory.get("nope") is None
    clock.advance(30)  # a is exactly 60 s old: still accepted
    assert memory.get("a") is not None
    clock.advance(0.5)
    assert memory.get("a") is None
    assert memory.get("b") is not None
    assert len(memory) == 1
    clock.advance(60)
    assert len(memory) == 0
    with pytest.raises(ShortlistNotFound):
        memory.mark_feedback("b")


def test_memory_evicts_oldest_beyond_max_entries() -> None:
    clock = FakeClock(0.0)
    memory = ShortlistMemory(retention_seconds=3600, max_entries=3, clock=clock)
    for i in range(5):
        memory.remember(shortlist(f"s{i}", created=0.0))
    assert len(memory) == 3
    assert [memory.get(f"s{i}") is not None for i in range(5)] == [False, False, True, True, True]


def test_mark_feedback_only_once() -> None:
    memory = ShortlistMemory(clock=FakeClock(1_000_000.0))
    memory.remember(shortlist("a"))
    assert memory.mark_feedback("a") is True
    assert memory.mark_feedback("a") is False
    memory.unmark_feedback("a")
    assert memory.mark_feedback("a") is True
    with pytest.raises(ShortlistNotFound) as exc:
        memory.mark_feedback("unknown")
    assert isinstance(exc.value, NotFound)
    assert exc.value.details == {"shortlist_id": "unknown"}


def test_mark_feedback_once_under_threads() -> None:
    memory = ShortlistMemory(clock=FakeClock(1_000_000.0))
    ids = [f"s{i}" for i in range(50)]
    for sid in ids:
        memory.remember(shortlist(sid))
    barrier = threading.Barrier(8)
    wins: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        for sid in ids:
            if memory.mark_feedback(sid):
                with lock:
                    wins.append(sid)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == sorted(ids)
