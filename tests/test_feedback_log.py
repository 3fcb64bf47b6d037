"""Feedback that is kept: the durable local log and the recorder that ties memory, log, window
and efficiency together. Fast and self-contained."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from registry.errors import ShortlistNotFound, ValidationFailed
from registry.feedback import (
    EquivalenceClasses,
    FeedbackEvent,
    FeedbackLog,
    FeedbackRecorder,
    FeedbackRequest,
    LiveWindow,
    LocalFeedbackLog,
    ShortlistMemory,
    ToolCall,
    ToolEfficiency,
)
from tests.feedback_helpers import TOOLS, FakeClock, make_event, shortlist

# -- durable log ------------------------------------------------------------------------------


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

    def read_after(self, position=None):
        start = position or 0
        return list(self.events[start:]), len(self.events)


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
    calls_json = [{"tool": c.tool, "useful": c.useful} for c in calls]
    return rec.submit(
        FeedbackRequest(sid, used, calls_json, success), known_tools=KNOWN.__getitem__, equivalence=EQUIV.__getitem__
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
