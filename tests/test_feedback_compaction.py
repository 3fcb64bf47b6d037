"""Compaction of the feedback log: old events are folded into a checkpoint of their counts and
cut from the log, the counts never change, and a crash at any step loses or doubles nothing.
Local JSONL log here; the Redis stream (real redis-server) at the end."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from registry.errors import ArtifactError
from registry.feedback import (
    CompactableFeedbackLog,
    FeedbackRecorder,
    LocalFeedbackLog,
    ShortlistMemory,
    ToolCall,
    ToolEfficiency,
)
from tests.feedback_helpers import assert_close_waits, clocked_recorder, make_event, submit_served


def events(n: int, start: float = 1000.0) -> list:
    """Events with varied tools and calls (so every count and the float trajectory sum move)."""
    out = []
    for i in range(n):
        calls = [ToolCall(f"t{i % 3}", i % 2 == 0), ToolCall("t1", i % 5 == 0)] if i % 4 else []
        out.append(make_event(f"s{i}", start + i, used=(f"t{i % 3}",), calls=calls))
    return out


def direct_counts(evs: list) -> dict:
    counts = ToolEfficiency()
    for e in evs:
        counts.add(e)
    return counts.to_state()


def restored(path: Path) -> tuple[ToolEfficiency, int]:
    """What a restarting service computes: checkpoint counts + replay of the rest. Also checks
    that archive + log hold every event exactly once, in order."""
    with LocalFeedbackLog(path) as log:
        counts = ToolEfficiency.from_state(log.checkpoint_state() or {})
        kept = list(log.replay())
        for e in kept:
            counts.add(e)
        assert log.pending_events() == len(kept)
        archived = list(log.archived_events())
        assert counts.to_state() == direct_counts(archived + kept)
        ids = [(e.shortlist_id, e.received) for e in archived + kept]
        assert len(ids) == len(set(ids))
    return counts, len(kept)


def test_efficiency_state_roundtrip() -> None:
    state = direct_counts(events(40))
    assert ToolEfficiency.from_state(json.loads(json.dumps(state))).to_state() == state
    with pytest.raises(ValueError):
        ToolEfficiency.from_state({"reg": {"events": 1}})


def test_local_compaction_keeps_the_counts_and_shrinks_the_log(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    evs = events(50)
    with LocalFeedbackLog(path) as log:
        assert isinstance(log, CompactableFeedbackLog)
        for e in evs:
            log.append(e)
        size_before = path.stat().st_size
        assert log.compact(cutoff=1000.0) == 0  # nothing older: nothing written
        assert not log.checkpoint_path.exists()
        assert log.compact(cutoff=1030.0) == 30
        assert log.pending_events() == 20 and path.stat().st_size < size_before
        assert [e.shortlist_id for e in log.replay()] == [f"s{i}" for i in range(30, 50)]
        more = events(10, start=2000.0)
        for e in more:
            log.append(e)
        assert log.compact(cutoff=1045.0) == 15  # a second generation
    counts, replayed = restored(path)
    assert replayed == 15
    assert counts.to_state() == direct_counts(evs + more)
    header = json.loads(path.read_bytes().split(b"\n", 1)[0])
    assert header == {"log_generation": 2}
    ck = json.loads((tmp_path / "checkpoint.json").read_text())
    assert ck["events_folded"] == 45 and ck["log_generation"] == 1
    with LocalFeedbackLog(path) as log:
        assert list(log.archived_events()) == (evs + more)[:45]
    assert len(list((tmp_path / "archive").glob("*.jsonl.gz"))) == 2
    with LocalFeedbackLog(tmp_path / "no-archive" / "events.jsonl", archive=False) as log:
        for e in evs:
            log.append(e)
        assert log.compact(cutoff=1030.0) == 30
        assert list(log.archived_events()) == [] and not (tmp_path / "no-archive" / "archive").exists()


def test_a_crash_at_any_step_loses_or_doubles_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    evs = events(40)
    want = direct_counts(evs)
    # crash while writing the checkpoint, and after it but before the rename
    import registry.feedback.log as fb

    for step in ("checkpoint", "rename"):
        path = tmp_path / step / "events.jsonl"
        with LocalFeedbackLog(path) as log:
            for e in evs:
                log.append(e)
            with monkeypatch.context() as m:
                if step == "checkpoint":
                    def boom(*args, **kwargs):
                        raise OSError("disk gone while writing the checkpoint")
                    m.setattr(fb, "atomic_write_bytes", boom)
                else:  # the checkpoint's own rename succeeds, the log's rename fails
                    real_replace = os.replace

                    def failing_replace(src, dst, real_replace=real_replace):
                        if str(dst).endswith("events.jsonl"):
                            raise OSError("disk gone before the log's rename")
                        real_replace(src, dst)
                    m.setattr(fb.os, "replace", failing_replace)
                with pytest.raises(OSError):
                    log.compact(cutoff=1025.0)
        counts, replayed = restored(path)
        assert counts.to_state() == want, step
        assert replayed == (40 if step == "checkpoint" else 15)
        assert not (path.parent / "events.jsonl.compacting").exists()
        # the log still works and compacts later
        with LocalFeedbackLog(path) as log:
            log.append(make_event("late", 5000.0))
            log.compact(cutoff=1035.0)
        counts, _ = restored(path)
        assert counts.to_state() == direct_counts([*evs, make_event("late", 5000.0)])


def test_crash_right_after_the_rename(tmp_path: Path) -> None:
    """The disk state right after the rename: a checkpoint of generation G next to the file of
    generation G+1 (exactly what a finished compaction leaves; the checkpoint is not rewritten
    after the rename). Reopening must replay the whole new file and count the cut events once."""
    path = tmp_path / "events.jsonl"
    evs = events(30)
    with LocalFeedbackLog(path) as log:
        for e in evs:
            log.append(e)
        log.compact(cutoff=1010.0)
    counts, replayed = restored(path)
    assert replayed == 20 and counts.to_state() == direct_counts(evs)


def test_appends_during_a_compaction_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    old = events(3000)
    new = [make_event(f"n{i}", 9000.0 + i) for i in range(400)]
    with LocalFeedbackLog(path) as log:
        for e in old:
            log.append(e)

        def write_new() -> None:
            for e in new:
                log.append(e)

        writer = threading.Thread(target=write_new)
        writer.start()
        folded = log.compact(cutoff=2500.0)
        writer.join()
        assert folded == 1500
        log.append(make_event("after", 9999.0))
    counts, replayed = restored(path)
    assert replayed == 1500 + 400 + 1
    assert counts.to_state()["reg"]["events"] == 3000 + 400 + 1


def test_missing_or_foreign_checkpoint_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with LocalFeedbackLog(path) as log:
        for e in events(10):
            log.append(e)
        log.compact(cutoff=1005.0)
    ck = tmp_path / "checkpoint.json"
    saved = ck.read_bytes()
    ck.unlink()
    with pytest.raises(ArtifactError, match=r"checkpoint .* is missing"):
        LocalFeedbackLog(path)
    doc = json.loads(saved)
    doc["log_generation"] = 7
    ck.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="does not belong"):
        LocalFeedbackLog(path)
    ck.write_text("{broken")
    with pytest.raises(ArtifactError, match="unreadable"):
        LocalFeedbackLog(path)
    ck.write_bytes(saved)
    counts, _ = restored(path)
    assert counts.to_state() == direct_counts(events(10))


def test_recorder_compacts_past_the_threshold_and_restores_the_same_report(tmp_path: Path) -> None:
    now = [100_000.0]
    log = LocalFeedbackLog.in_data_dir(tmp_path)
    rec = clocked_recorder(ShortlistMemory(10**9), log, lambda: now[0], compact_after_events=20,
                           compact_margin_seconds=60, min_compact_interval_seconds=0)
    for i in range(30):
        now[0] = 100_000.0 + 60 * i  # one event a minute for half an hour
        submit_served(rec, f"s{i}")
    now[0] += 3 * 3600  # later: the first events are now older than window + margin
    submit_served(rec, "late")
    for _ in range(100):
        if log.pending_events() < 31:
            break
        # a compaction started by an earlier event may still hold the lock (slow under load), so
        # the late one was skipped; retry as the sync tick does
        rec.maybe_compact()
        time.sleep(0.05)
    assert rec.compactions >= 1 and log.pending_events() < 31
    report = rec.efficiency.report("r")
    rec.close()
    log.close()
    again = clocked_recorder(ShortlistMemory(), LocalFeedbackLog.in_data_dir(tmp_path), lambda: now[0])
    again.restore()
    assert again.efficiency.report("r") == report and report["events"] == 31
    assert again.window.stats("r", "exact").events == rec.window.stats("r", "exact").events == 1


# -- Redis stream ---------------------------------------------------------------------------------


@pytest.fixture
def redis_client(redis_server):
    from registry.store.redis import connect

    return connect(redis_server.url)


def _redis_recorder(client, prefix: str, clock=time.time) -> FeedbackRecorder:
    from registry.store.redis import RedisFeedbackLog, RedisShortlistMemory

    return clocked_recorder(RedisShortlistMemory(client, 600, prefix), RedisFeedbackLog(client, prefix),
                            clock, min_compact_interval_seconds=0)


def test_redis_compaction_checkpoint_trim_and_a_fresh_replica(redis_client, redis_server, redis_prefix) -> None:
    from registry.store.redis import RedisFeedbackLog, connect

    log = RedisFeedbackLog(redis_client, redis_prefix)
    evs = events(2500)  # more than one XRANGE page
    for e in evs:
        log.append(e)
    time.sleep(0.01)
    cutoff = time.time() + 0.001
    later = events(7, start=5000.0)
    assert log.compact(cutoff) == 2500
    for e in later:
        log.append(e)
    assert log.pending_events() == 7 and log.compact(cutoff) == 0
    fresh = _redis_recorder(connect(redis_server.url), redis_prefix)
    assert fresh.restore() == 7
    assert fresh.efficiency.to_state() == direct_counts(evs + later)
    assert [e.shortlist_id for e in RedisFeedbackLog(redis_client, redis_prefix).replay()] == [
        e.shortlist_id for e in later]


def test_redis_crash_between_checkpoint_and_trim_counts_nothing_twice(redis_client, redis_prefix, monkeypatch) -> None:
    from registry.errors import StoreUnavailable
    from registry.store.redis import RedisFeedbackLog

    log = RedisFeedbackLog(redis_client, redis_prefix)
    evs = events(30)
    for e in evs:
        log.append(e)
    import redis as redis_lib

    def boom(*args, **kwargs):
        raise redis_lib.exceptions.ConnectionError("gone")

    monkeypatch.setattr(redis_client, "xtrim", boom)
    with pytest.raises(StoreUnavailable):
        log.compact(time.time() + 1)
    monkeypatch.undo()
    assert log.pending_events() == 30  # not trimmed, but covered by the checkpoint
    rec = _redis_recorder(redis_client, redis_prefix)
    assert rec.restore() == 0
    assert rec.efficiency.to_state() == direct_counts(evs)
    assert redis_client.get(log.lock_key) is None  # the lock was released


def test_a_replica_behind_a_compaction_resyncs(redis_client, redis_server, redis_prefix) -> None:
    from registry.store.redis import RedisFeedbackLog, connect

    a = _redis_recorder(redis_client, redis_prefix)
    b = _redis_recorder(connect(redis_server.url), redis_prefix)
    a.restore()
    b.restore()
    for i in range(5):
        submit_served(a, f"a{i}")
        submit_served(b, f"b{i}")
    assert a.catch_up() == 5 and b.catch_up() == 5
    for i in range(5, 12):
        submit_served(a, f"a{i}")  # b has not read these when a compacts them away
    submit_served(b, "b-own")
    assert isinstance(a.log, RedisFeedbackLog)
    assert a.log.compact(time.time() + 1) == 18
    submit_served(a, "a-after")
    b.catch_up()  # LogCompacted -> resync from the checkpoint
    a.catch_up()  # b-own
    assert b.efficiency.to_state() == a.efficiency.to_state()
    assert b.efficiency.report("r")["events"] == 19
    assert b.window.stats("r", "exact").events == a.window.stats("r", "exact").events
    submit_served(b, "b-after")  # own events after the resync are counted once
    a.catch_up()
    b.catch_up()
    assert b.efficiency.to_state() == a.efficiency.to_state()
    assert a.efficiency.report("r")["events"] == 20


def test_one_compaction_at_a_time(redis_client, redis_prefix) -> None:
    from registry.store.redis import RedisFeedbackLog

    log = RedisFeedbackLog(redis_client, redis_prefix)
    for e in events(5):
        log.append(e)
    redis_client.set(log.lock_key, "someone else", px=10_000)
    assert log.compact(time.time() + 1) == 0 and log.pending_events() == 5
    redis_client.delete(log.lock_key)
    assert log.compact(time.time() + 1) == 5 and log.pending_events() == 0


def test_closing_the_recorder_waits_for_its_running_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = LocalFeedbackLog.in_data_dir(tmp_path)
    started, release = threading.Event(), threading.Event()
    compact = log.compact

    def slow_compact(cutoff: float) -> int:
        started.set()
        release.wait(10)
        return compact(cutoff)

    monkeypatch.setattr(log, "compact", slow_compact)
    rec = clocked_recorder(ShortlistMemory(), log, time.time, compact_after_events=1,
                           min_compact_interval_seconds=0)
    submit_served(rec, "s0")
    submit_served(rec, "s1")  # past the threshold: a compaction starts on its own thread
    assert_close_waits(rec.close, started, release)
    assert rec.compactions == 1
    assert not any(t.name == "feedback-compaction" and t.is_alive() for t in threading.enumerate())
    rec.close()  # nothing running: returns at once
    log.close()
