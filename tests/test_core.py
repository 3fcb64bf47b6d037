"""The core used in-process, with no HTTP: shortlist, feedback, counts and the report."""

from __future__ import annotations

import pytest

from registry.feedback import FeedbackRequest
from registry.request import ShortlistRequest
from tests.conftest import weather_tools


def test_not_ready_until_started(make_core):
    from registry.errors import NotReady

    core = make_core(start=False)
    assert not core.ready
    with pytest.raises(NotReady, match="still loading"):
        core.shortlist(ShortlistRequest("tools", "weather in Paris"))
    core.start(background=True)
    assert core.wait_ready(30) and core.ready


def test_shortlist_then_feedback_shows_in_counts_and_report(make_core):
    from registry.snapshots import RegistryChange

    core = make_core()
    changes: list[RegistryChange] = []
    served, events = [], []
    core.add_registry_listener(changes.append)
    core.add_shortlist_listener(served.append)
    core.add_feedback_listener(events.append)

    info = core.put_registry("tools", weather_tools())
    assert (info.registry, info.version, info.tools) == ("tools", 1, 4)
    assert [c.info for c in changes] == [info]

    result = core.shortlist(ShortlistRequest("tools", "what is the weather in Paris", k=2))
    assert result.k == 2 and served == [result]
    shown = [item.name for item in result.tools]
    assert "get_weather" in shown

    recorded = core.feedback(
        FeedbackRequest(result.shortlist_id, ["get_weather"], [{"tool": "get_weather", "useful": True}], True)
    )
    assert not recorded.duplicate and recorded.event.presented_exact
    assert recorded.event.p_rand_exact == pytest.approx(2 / 4)  # K=2 of N=4, one used tool
    assert events == [recorded.event]

    again = core.feedback(FeedbackRequest(result.shortlist_id, ["get_weather"]))
    assert again.duplicate and len(events) == 1  # a resend is not counted twice

    stats = core.window.stats("tools", "exact")
    assert stats.events == 1 and stats.presentation_rate == 1.0
    report = core.report("tools")
    assert report["events"] == 1 and report["mean_trajectory_efficiency"] == 1.0
    rows = {row["name"]: row for row in report["tools"]}
    assert set(rows) == {"get_weather", "send_email", "convert_currency", "fs/read_file"}
    assert rows["get_weather"]["used"] == 1 and rows["get_weather"]["useful_calls"] == 1
    assert sum(row["shown"] for row in rows.values()) == 2


def test_feedback_checks_names_against_the_registry(make_core):
    from registry.errors import ShortlistNotFound, ValidationFailed

    core = make_core()
    core.put_registry("tools", weather_tools())
    result = core.shortlist(ShortlistRequest("tools", "send an email", k=1))
    with pytest.raises(ValidationFailed):
        core.feedback(FeedbackRequest(result.shortlist_id, ["no_such_tool"]))
    with pytest.raises(ShortlistNotFound):
        core.feedback(FeedbackRequest("never-served", ["send_email"]))
    assert core.report("tools")["events"] == 0  # nothing was recorded


def test_admin_operations_notify_and_feedback_survives_a_restart(make_core):
    from registry.errors import RegistryNotFound

    core = make_core()
    changes = []
    core.add_registry_listener(changes.append)
    core.put_registry("tools", weather_tools()[:2])
    info = core.upsert_tools("tools", weather_tools()[2:])
    assert info.tools == 4 and info.version == 2
    assert core.delete_tool("tools", "fs/read_file").tools == 3
    result = core.shortlist(ShortlistRequest("tools", "convert 20 euros to yen", k=1))
    core.feedback(FeedbackRequest(result.shortlist_id, [result.tools[0].name]))
    core.close()

    restarted = make_core()  # same data dir: registries and feedback counts come back
    assert [i.registry for i in restarted.list_registries()] == ["tools"]
    assert restarted.report("tools")["events"] == 1
    restarted.delete_registry("tools")
    assert changes[-1].info is not None  # the first core's listeners saw only its own writes
    with pytest.raises(RegistryNotFound):
        restarted.snapshot("tools")


def test_demo_registry_is_loaded_from_settings(make_core):
    from registry.core import DEMO_REGISTRY
    from registry.settings import Settings

    core = make_core(demo_registry=Settings().demo_registry)
    assert [i.registry for i in core.list_registries()] == [DEMO_REGISTRY]
    assert core.shortlist(ShortlistRequest(DEMO_REGISTRY, "weather in Paris")).k >= 1


def test_close_waits_for_a_running_feedback_compaction(make_core, monkeypatch):
    """A compaction started by feedback must not outlive the core (it would log to streams a
    test or the server has closed): close() waits for it and joins its thread."""
    import threading

    from tests.feedback_helpers import assert_close_waits

    core = make_core(feedback_compact_events=1, feedback_compact_interval_seconds=0)
    started, release = threading.Event(), threading.Event()

    def slow_checkpoint() -> bool:  # the learner's save before a compaction, held up
        started.set()
        release.wait(10)
        return True

    monkeypatch.setattr(core.feedback_recorder, "before_compact", slow_checkpoint)
    core.put_registry("tools", weather_tools())
    for _ in range(2):  # the second event passes the threshold of one: a compaction starts
        result = core.shortlist(ShortlistRequest("tools", "weather in Paris"))
        core.feedback(FeedbackRequest(result.shortlist_id, ["get_weather"]))
    assert_close_waits(core.close, started, release)
    assert core.feedback_recorder.compactions == 1
    assert not any(t.name == "feedback-compaction" and t.is_alive() for t in threading.enumerate())
