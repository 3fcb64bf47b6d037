"""Feedback: equivalence classes, event scoring, shortlist memory, durable log, live window,
tool efficiency and the recorder that ties them together. Fast and self-contained."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import hypergeom

from registry.errors import NotFound, ShortlistNotFound, ValidationFailed
from registry.feedback import (
    EquivalenceClasses,
    FeedbackEvent,
    FeedbackLog,
    FeedbackRecorder,
    LiveWindow,
    LocalFeedbackLog,
    ShortlistMemory,
    ShownShortlist,
    ToolCall,
    ToolEfficiency,
    build_event,
    parse_feedback,
    validate_equivalents,
)


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


TOOLS = [f"t{i}" for i in range(20)]


def shortlist(
    sid: str = "s1",
    shown: Sequence[str] = ("t0", "t1", "t2"),
    *,
    registry: str = "reg",
    n_tools: int = 20,
    k: int | None = None,
    created: float = 1_000_000.0,
) -> ShownShortlist:
    return ShownShortlist(
        shortlist_id=sid,
        registry=registry,
        version=1,
        n_tools=n_tools,
        k=len(shown) if k is None else k,
        shown=tuple(shown),
        created=created,
    )


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


# -- durable log ------------------------------------------------------------------------------


def make_event(
    sid: str,
    received: float,
    *,
    registry: str = "reg",
    shown: Sequence[str] = ("t0", "t1", "t2"),
    used: Sequence[str] = ("t1",),
    calls: Sequence[ToolCall] = (),
) -> FeedbackEvent:
    return build_event(
        shortlist(sid, shown, registry=registry),
        list(used),
        list(calls),
        None,
        TOOLS,
        EquivalenceClasses(),
        received,
    )


def test_local_log_append_reopen_replay(tmp_path: Path) -> None:
    events = [make_event(f"s{i}", float(i), used=(f"t{i}",)) for i in range(5)]
    log = LocalFeedbackLog.in_data_dir(tmp_path)
    assert isinstance(log, FeedbackLog)
    assert list(log.replay()) == []
    for event in events:
        log.append(event)
    log.close()
    assert log.path == tmp_path / "feedback" / "events.jsonl"
    with LocalFeedbackLog(log.path) as reopened:
        assert list(reopened.replay()) == events


def test_local_log_skips_torn_last_line_and_keeps_appending(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    first = [make_event("a", 1.0), make_event("b", 2.0)]
    with LocalFeedbackLog(path) as log:
        for event in first:
            log.append(event)
    # Crash mid-append: half a line, no newline.
    whole = json.dumps(make_event("c", 3.0).to_json())
    with open(path, "ab") as handle:
        handle.write(whole[: len(whole) // 2].encode())
    with LocalFeedbackLog(path) as log:
        assert list(log.replay()) == first
        later = make_event("d", 4.0)
        log.append(later)
        assert list(log.replay()) == [*first, later]
        assert log.skipped == 0
    assert path.read_bytes().endswith(b"\n")
    # replay() of a closed log reads the file as it is and skips a torn tail too.
    with open(path, "ab") as handle:
        handle.write(b'{"shortlist_id": "e"')
    assert list(log.replay()) == [*first, later]
    assert log.skipped == 1


def test_local_log_cuts_a_failed_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    log = LocalFeedbackLog(tmp_path / "events.jsonl")
    first = make_event("a", 1.0)
    log.append(first)

    def broken_fsync(fd: int) -> None:
        raise OSError("EIO")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    from registry.errors import StorageUnavailable

    with pytest.raises(StorageUnavailable):  # the domain error for a failing disk (a 503)
        log.append(make_event("b", 2.0))
    monkeypatch.undo()
    later = make_event("c", 3.0)
    log.append(later)
    assert list(log.replay()) == [first, later]
    log.close()
    log.close()
    assert list(log.replay()) == [first, later]
    with pytest.raises(ValueError):
        log.append(later)


def test_local_log_skips_an_unreadable_middle_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    a, b = make_event("a", 1.0), make_event("b", 2.0)
    with LocalFeedbackLog(path) as log:
        log.append(a)
    with open(path, "ab") as handle:
        handle.write(b'not json\n{"shortlist_id": "x"}\n')
    with LocalFeedbackLog(path) as log:
        log.append(b)
        assert list(log.replay()) == [a, b]
        assert log.skipped == 2


def test_local_log_torn_only_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"shortlist')
    with LocalFeedbackLog(path) as log:
        assert list(log.replay()) == []
        event = make_event("a", 1.0)
        log.append(event)
        assert list(log.replay()) == [event]


# -- live window ------------------------------------------------------------------------------


def window_event(
    received: float, presented: bool, p: float, registry: str = "reg"
) -> FeedbackEvent:
    return FeedbackEvent(
        shortlist_id="x",
        registry=registry,
        version=1,
        n_tools=10,
        k=1,
        shown=("a",),
        used=("a",) if presented else ("b",),
        success=None,
        calls=(),
        presented_exact=presented,
        presented_equivalent=True,
        p_rand_exact=p,
        p_rand_equivalent=min(1.0, 2 * p),
        received=received,
    )


def test_window_conventions_and_expiry() -> None:
    clock = FakeClock(1000.0)
    window = LiveWindow(window_seconds=100, clock=clock, resolution_seconds=1.0)
    empty = window.stats("reg", "exact")
    assert empty.events == 0
    assert math.isnan(empty.presentation_rate)
    assert math.isnan(empty.mean_p_rand)
    assert math.isnan(empty.bor_bits)

    window.add(window_event(1000.0, False, 0.1))
    never = window.stats("reg", "exact")
    assert (never.events, never.presented, never.presentation_rate) == (1, 0, 0.0)
    assert math.isclose(never.mean_p_rand, 0.1)
    assert math.isnan(never.bor_bits)  # rate 0: log2(0) is -inf, reported as NaN

    clock.advance(50)
    window.add(window_event(1050.0, True, 0.3))
    s = window.stats("reg", "exact")
    assert (s.events, s.presented) == (2, 1)
    assert math.isclose(s.presentation_rate, 0.5)
    assert math.isclose(s.mean_p_rand, 0.2)
    assert math.isclose(s.bor_bits, math.log2(0.5 / 0.2))
    e = window.stats("reg", "equivalent")
    assert (e.events, e.presentation_rate) == (2, 1.0)
    assert math.isclose(e.bor_bits, math.log2(1.0 / 0.4))

    clock.advance(51)  # the first event (bucket [1000, 1001)) ends at the cutoff 1001
    s = window.stats("reg", "exact")
    assert (s.events, s.presented) == (1, 1)
    assert math.isclose(s.bor_bits, math.log2(1 / 0.3))
    clock.advance(100)
    assert window.stats("reg", "exact").events == 0
    assert window.keys() == [("reg", "equivalent"), ("reg", "exact")]
    window.add(window_event(clock() - 500, True, 0.5))  # already outside: ignored
    assert window.stats("reg", "exact").events == 0
    window.forget("reg")
    assert window.keys() == []
    with pytest.raises(ValueError):
        window.stats("reg", "fuzzy")


op_strategy = st.one_of(
    st.tuples(
        st.just("add"),
        st.floats(min_value=-30.0, max_value=5.0),  # event time relative to now (late/early)
        st.booleans(),
        st.one_of(
            st.floats(min_value=0.0, max_value=1.0),
            st.sampled_from([0.0, 5e-324, 1e-300, 1e-7, 0.1, 1.0]),
        ),
        st.sampled_from(["r1", "r2"]),
    ),
    st.tuples(st.just("tick"), st.floats(min_value=0.0, max_value=25.0)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(op_strategy, max_size=60),
    window_seconds=st.sampled_from([10.0, 30.0, 45.5]),
    resolution=st.sampled_from([0.25, 1.0, 3.0]),
)
def test_window_running_sums_match_recomputation(
    ops: list[tuple], window_seconds: float, resolution: float
) -> None:
    clock = FakeClock(10_000.0)
    window = LiveWindow(window_seconds=window_seconds, clock=clock, resolution_seconds=resolution)
    added: list[FeedbackEvent] = []

    def alive(event: FeedbackEvent, now: float) -> bool:
        bucket = math.floor(event.received / resolution)
        return not (bucket + 1) * resolution <= now - window_seconds

    def check() -> None:
        now = clock()
        for registry in ("r1", "r2"):
            for match in ("exact", "equivalent"):
                live = [e for e in added if e.registry == registry and alive(e, now)]
                got = window.stats(registry, match)
                assert got.events == len(live)
                if not live:
                    assert math.isnan(got.presentation_rate) and math.isnan(got.bor_bits)
                    continue
                presented = sum(e.presented(match) for e in live)
                # exact rational mean, correctly rounded: the running sums must not drift
                mean_p = float(sum(Fraction(e.p_rand(match)) for e in live) / len(live))
                assert got.presented == presented
                assert got.presentation_rate == presented / len(live)
                assert got.mean_p_rand == mean_p
                if presented and mean_p > 0:
                    want = math.log2(presented / len(live)) - math.log2(mean_p)
                    assert math.isclose(got.bor_bits, want, rel_tol=1e-9, abs_tol=1e-9)
                else:
                    assert math.isnan(got.bor_bits)

    for op in ops:
        if op[0] == "add":
            _, offset, presented, p, registry = op
            event = window_event(clock() + offset, presented, p, registry)
            window.add(event)
            added.append(event)
        else:
            clock.advance(op[1])
        check()


# -- tool efficiency --------------------------------------------------------------------------


def hand_made_events() -> list[FeedbackEvent]:
    return [
        make_event(
            "e1",
            1.0,
            shown=("a", "b", "c"),
            used=("a",),
            calls=(ToolCall("a", True), ToolCall("a", True), ToolCall("b", False)),
        ),
        make_event(
            "e2",
            2.0,
            shown=("a", "c"),
            used=("a", "c"),
            calls=(
                ToolCall("c", False),
                ToolCall("a", False),
                ToolCall("c", False),
                ToolCall("a", True),
            ),
        ),
        make_event("e3", 3.0, shown=("b", "c"), used=("b",)),  # no calls: no trajectory
    ]


def test_tool_efficiency_hand_made_example() -> None:
    eff = ToolEfficiency()
    for event in hand_made_events():
        eff.add(event)
    report = eff.report("reg", min_calls=3, min_shown=3)
    assert report["registry"] == "reg"
    assert report["events"] == 3
    # trajectories: e1 2/3 useful, e2 1/4 useful
    assert math.isclose(report["mean_trajectory_efficiency"], (2 / 3 + 1 / 4) / 2)
    rows = {row["name"]: row for row in report["tools"]}
    assert [row["name"] for row in report["tools"]] == ["a", "b", "c"]
    assert rows["a"] == {
        "name": "a",
        "shown": 2,
        "used": 2,
        "useful_calls": 3,
        "useless_calls": 1,
        "aggregate_utility": 2,
        "efficiency": 0.75,
    }
    assert rows["b"] == {
        "name": "b",
        "shown": 2,
        "used": 1,
        "useful_calls": 0,
        "useless_calls": 1,
        "aggregate_utility": -1,
        "efficiency": 0.0,
    }
    assert rows["c"] == {
        "name": "c",
        "shown": 3,
        "used": 1,
        "useful_calls": 0,
        "useless_calls": 2,
        "aggregate_utility": -2,
        "efficiency": 0.0,
    }
    # b has one call (< min_calls=3) and was used; c: 2 calls < 3, used once -> none yet
    assert report["prune_candidates"] == []
    assert eff.report("reg", min_calls=2, min_shown=3)["prune_candidates"] == ["c"]
    assert eff.report("reg", min_calls=1, min_shown=3)["prune_candidates"] == ["b", "c"]


def test_tool_efficiency_prune_by_shown_never_used_and_listing_all_tools() -> None:
    eff = ToolEfficiency()
    for i in range(4):
        eff.add(make_event(f"s{i}", float(i), shown=("idle", "t1"), used=("t1",)))
    report = eff.report("reg", tools=["t1", "idle", "fresh"], min_calls=5, min_shown=4)
    assert [row["name"] for row in report["tools"]] == ["fresh", "idle", "t1"]
    assert report["prune_candidates"] == ["idle"]  # shown 4 times, never used
    fresh = report["tools"][0]
    assert fresh == {
        "name": "fresh",
        "shown": 0,
        "used": 0,
        "useful_calls": 0,
        "useless_calls": 0,
        "aggregate_utility": 0,
        "efficiency": None,
    }
    assert report["mean_trajectory_efficiency"] is None
    # Exactly min_calls calls with zero aggregate utility is a candidate (<= 0).
    eff.add(
        make_event(
            "z",
            9.0,
            shown=("t1",),
            used=("t1",),
            calls=(ToolCall("t1", True), ToolCall("t1", False)),
        )
    )
    assert eff.report("reg", min_calls=2, min_shown=100)["prune_candidates"] == ["t1"]
    empty = eff.report("other")
    assert (empty["events"], empty["tools"], empty["prune_candidates"]) == (0, [], [])
    eff.forget("reg")
    assert eff.report("reg")["events"] == 0


# -- recorder ---------------------------------------------------------------------------------


class MemoryLog:
    def __init__(self) -> None:
        self.events: list[FeedbackEvent] = []
        self.fail = False

    def append(self, event: FeedbackEvent) -> None:
        if self.fail:
            raise OSError("disk full")
        self.events.append(event)

    def replay(self):
        return iter(list(self.events))


def make_recorder(log: FeedbackLog, clock: FakeClock, listeners=()) -> FeedbackRecorder:
    return FeedbackRecorder(
        ShortlistMemory(retention_seconds=600, clock=clock),
        log,
        LiveWindow(window_seconds=100, clock=clock),
        ToolEfficiency(),
        clock=clock,
        on_event=listeners,
    )


KNOWN = {"reg": set(TOOLS)}
EQUIV = {"reg": EquivalenceClasses([["t1", "t9"]])}


def submit(rec: FeedbackRecorder, sid: str, used, calls=(), success=None):
    return rec.submit(
        sid,
        used,
        [{"tool": c.tool, "useful": c.useful} for c in calls],
        success,
        known_tools=KNOWN.__getitem__,
        equivalence=EQUIV.__getitem__,
    )


def test_recorder_resend_is_not_double_counted(tmp_path: Path) -> None:
    clock = FakeClock()
    seen: list[FeedbackEvent] = []
    log = LocalFeedbackLog(tmp_path / "events.jsonl")
    rec = make_recorder(log, clock, [seen.append])
    rec.remember(shortlist("s1", shown=("t0", "t1"), created=clock()))

    with pytest.raises(ShortlistNotFound):
        submit(rec, "nope", ["t0"])
    with pytest.raises(ValidationFailed):
        submit(rec, "s1", ["not-a-tool"])
    assert list(log.replay()) == []  # nothing recorded on a bad request

    event, resent = submit(rec, "s1", ["t9"], [ToolCall("t9", True)], True)
    assert resent is False
    assert (event.presented_exact, event.presented_equivalent) == (False, True)
    again, resent = submit(rec, "s1", ["t9"], [ToolCall("t9", True)], True)
    assert resent is True
    assert again.shortlist_id == "s1"
    assert list(log.replay()) == [event]
    assert seen == [event]
    assert rec.window.stats("reg", "exact").events == 1
    assert rec.efficiency.report("reg")["events"] == 1

    clock.advance(601)
    with pytest.raises(ShortlistNotFound):
        submit(rec, "s1", ["t9"])


def test_recorder_failed_append_allows_retry() -> None:
    clock = FakeClock()
    log = MemoryLog()
    rec = make_recorder(log, clock)
    rec.remember(shortlist("s1", created=clock()))
    log.fail = True
    with pytest.raises(OSError):
        submit(rec, "s1", ["t0"])
    assert rec.efficiency.report("reg")["events"] == 0
    log.fail = False
    _, resent = submit(rec, "s1", ["t0"])
    assert resent is False
    assert len(log.events) == 1


def test_recorder_concurrent_submits_count_once() -> None:
    clock = FakeClock()
    log = MemoryLog()
    rec = make_recorder(log, clock)
    rec.remember(shortlist("s1", created=clock()))
    barrier = threading.Barrier(8)
    results: list[bool] = []

    def worker() -> None:
        barrier.wait()
        results.append(submit(rec, "s1", ["t0"])[1])

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] + [True] * 7
    assert len(log.events) == 1


def test_recorder_restore_rebuilds_the_same_report(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "feedback" / "events.jsonl"
    rec = make_recorder(LocalFeedbackLog(path), clock)
    plan = [
        (["t0"], [ToolCall("t0", True), ToolCall("t3", False)]),
        (["t9"], [ToolCall("t9", False)]),
        (["t2", "t4"], []),
        (["t4"], [ToolCall("t4", True), ToolCall("t4", True), ToolCall("t0", False)]),
    ]
    for i, (used, calls) in enumerate(plan):
        rec.remember(shortlist(f"s{i}", shown=("t0", "t1", "t2"), created=clock()))
        submit(rec, f"s{i}", used, calls, i % 2 == 0)
        submit(rec, f"s{i}", used, calls, i % 2 == 0)  # a resend each time
        clock.advance(40)
    before = rec.efficiency.report("reg", tools=TOOLS)
    window_before = {m: rec.window.stats("reg", m) for m in ("exact", "equivalent")}
    rec.log.close()  # type: ignore[attr-defined]

    fresh = make_recorder(LocalFeedbackLog(path), clock)
    assert fresh.restore() == len(plan)
    assert fresh.efficiency.report("reg", tools=TOOLS) == before
    for match, stats in window_before.items():
        assert fresh.window.stats("reg", match) == stats
    # Events came at +0, +40, +80, +120 s; now is +160 and the window 100 s: two are left.
    assert window_before["exact"].events == 2
