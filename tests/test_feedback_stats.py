"""Feedback figures: the live window (BoR, presentation rate) and per-tool efficiency. Fast and
self-contained."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry.feedback import (
    FeedbackEvent,
    LiveWindow,
    ToolCall,
    ToolEfficiency,
)
from tests.feedback_helpers import FakeClock, make_event

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
