"""A Redis that loses its data (FLUSHALL, or a restart without persistence) deletes nothing:
replicas notice within a sync interval, exactly one re-publishes what it holds, versions never go
backwards, and writes racing the wipe land on top of the re-published versions. Against real
`redis-server` processes (nothing persisted), with two replicas sharing each one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise

import pytest
from pydantic import SecretStr

from registry.assembly import Registries
from registry.errors import RegistryNotFound, StoreUnavailable
from registry.feedback import FeedbackRequest
from registry.request import ShortlistRequest
from registry.store.redis import RedisStore, connect
from registry.writes.sync import StoreSync
from tests.conftest import weather_tools
from tests.cores import new_core, new_engine
from tests.redis_server import RedisServer

DETECT_SECONDS = 5.0  # the bound: a wipe is noticed and repaired within this
SETTLE_SECONDS = 5.0  # writes wait this long after a wipe (StoreSync's default at a 1 s poll)


@pytest.fixture
def own_redis(tmp_path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    yield server
    server.stop()


@pytest.fixture
def make_core(settings, bor_policy, own_redis, redis_prefix):

    cores = []

    def make():
        core = new_core(
            settings, bor_policy=bor_policy,
            redis_url=SecretStr(own_redis.url), redis_prefix=redis_prefix, sync_interval_seconds=1.0,
        )
        cores.append(core)
        return core

    yield make
    for core in cores:
        core.close()


def tool(name: str, text: str) -> dict:
    return {"name": name, "description": text, "parameters": {"type": "object", "properties": {}}}


def wait(condition: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        time.sleep(0.02)
    return time.monotonic() - start


@dataclass
class Load:
    """One thread alternating queries and one-tool upserts over two replicas."""

    cores: list
    acknowledged: list[tuple[str, int]] = field(default_factory=list)  # (tool, version)
    acknowledged_at: list[float] = field(default_factory=list)  # wall clock, per write
    refused: list[str] = field(default_factory=list)  # writes answered 503 (Redis down)
    query_errors: list[str] = field(default_factory=list)
    queries: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            core = self.cores[i % 2]
            try:
                result = core.shortlist(ShortlistRequest("r1", "weather in Paris", k=2))
                assert result.tools
                self.queries += 1
            except (RegistryNotFound, AssertionError) as exc:
                self.query_errors.append(f"{type(exc).__name__}: {exc}")
            try:
                info = core.upsert_tools("r1", [tool(f"load_{i}", f"Load tool number {i}.")])
                self.acknowledged.append((f"load_{i}", info.version))
                self.acknowledged_at.append(time.time())
            except StoreUnavailable:
                self.refused.append(f"load_{i}")
            i += 1
            time.sleep(0.01)


def seed(a, b) -> dict:
    """Two registries (one with equivalents), a few versions, feedback on both replicas."""
    a.put_registry("r1", weather_tools())
    for n in range(4):
        a.upsert_tools("r1", [tool(f"seed_{n}", f"Seed tool {n}.")])
    a.put_registry(
        "r2",
        {"tools": [tool("x", "Tool x."), tool("y", "Tool y.")], "equivalents": [["x", "y"]]},
    )
    wait(lambda: b.snapshots.current("r1") is not None and b.snapshots.current("r1").version == 5, 5, "b in step")
    wait(lambda: b.snapshots.current("r2") is not None, 5, "b has r2")
    for core in (a, b, a):
        served = core.shortlist(ShortlistRequest("r1", "weather in Paris", k=2))
        core.feedback(FeedbackRequest(served.shortlist_id, [served.tools[0].name]))
    wait(lambda: a.feedback_recorder.efficiency.to_state() == b.feedback_recorder.efficiency.to_state(),
         5, "feedback counts in step")
    return a.feedback_recorder.efficiency.to_state()


def check_after(a, b, load: Load, counts_before: dict, make_core) -> None:
    assert load.query_errors == [], load.query_errors[:3]
    assert load.queries > 20
    versions = [v for _, v in load.acknowledged]
    assert versions == sorted(versions) and len(set(versions)) == len(versions), "versions went backwards"
    assert versions and versions[0] > 5, "a write after the wipe restarted the numbering"
    # Every acknowledged tool and every seeded one is in the store, under the newest version.
    store = RedisStore(connect(a.settings.redis_url.get_secret_value()), a.settings.redis_prefix)
    record = store.load("r1")
    assert record is not None and record.version == versions[-1]
    names = {t.get("name") or t["function"]["name"] for t in record.tools}
    assert {"get_weather", "send_email", "seed_0", "seed_3"} <= names
    assert {name for name, _ in load.acknowledged} <= names
    r2 = store.load("r2")
    assert r2 is not None and r2.version == 1 and r2.equivalents == [["x", "y"]]
    # Exactly one replica re-published; the other adopted its work.
    recoveries = a.store.epoch.recoveries + b.store.epoch.recoveries
    assert len(recoveries) == 2 and sorted(r.won for r in recoveries) == [False, True]
    assert [r.registries for r in recoveries if r.won] == [2]
    # the other writes back only what it holds newer than the winner: at most the r1 version it
    # had just written itself when the wipe came (the winner had not synced it yet)
    assert [r.registries for r in recoveries if not r.won] in ([0], [1])
    # Both replicas converge on the same versions, with the feedback counts of before the wipe.
    wait(lambda: a.snapshots.current("r1").version == b.snapshots.current("r1").version == versions[-1], 5, "convergence")
    wait(lambda: a.feedback_recorder.efficiency.to_state() == b.feedback_recorder.efficiency.to_state(),
         5, "feedback counts in step after the wipe")
    assert a.feedback_recorder.efficiency.to_state() == counts_before
    # A replica started afterwards restores the same counts from the re-published checkpoint.
    c = make_core()
    assert c.feedback_recorder.efficiency.to_state() == counts_before
    assert {i.registry: i.version for i in c.list_registries()} == {"r1": versions[-1], "r2": 1}


def print_stall(load: Load, since: float) -> None:
    """Writes pause for the settling window after a wipe, then go on."""
    after = [t for t in load.acknowledged_at if t > since]
    assert len(after) > 5, "writes did not resume after the wipe"
    times = load.acknowledged_at
    gap = max(b - a for a, b in pairwise(times))
    print(f"writes paused at most {gap:.2f} s around the wipe; {len(after)} acknowledged after it")


def time_to_recover(cores) -> float:
    return max(core.store.epoch.recoveries[0].at for core in cores)


def test_flushall_under_load_deletes_nothing(make_core, own_redis):
    a, b = make_core(), make_core()
    counts = seed(a, b)
    load = Load([a, b])
    thread = threading.Thread(target=load.run)
    thread.start()
    try:
        time.sleep(0.5)
        wiped_at = time.time()
        own_redis.client().flushall()
        detected = wait(lambda: all(c.store.epoch.recoveries for c in (a, b)), DETECT_SECONDS, "both replicas recover")
        time.sleep(SETTLE_SECONDS + 1.5)  # writes resume after the settling window
    finally:
        load.stop.set()
        thread.join(10)
    print_stall(load, wiped_at)
    print(f"flush: recovered on both replicas {time_to_recover([a, b]) - wiped_at:.3f} s after FLUSHALL "
          f"(waited {detected:.3f} s); winner re-publish "
          f"{next(r.seconds for c in (a, b) for r in c.store.epoch.recoveries if r.won) * 1000:.1f} ms")
    assert load.refused == []  # a flush is not an outage: no write fails
    check_after(a, b, load, counts, make_core)


def test_restart_without_persistence_under_load_deletes_nothing(make_core, own_redis):
    a, b = make_core(), make_core()
    counts = seed(a, b)
    load = Load([a, b])
    thread = threading.Thread(target=load.run)
    thread.start()
    try:
        time.sleep(0.5)
        own_redis.stop()
        time.sleep(1.0)  # an outage: queries are served from memory, writes get 503
        restarted_at = time.time()
        own_redis.start()  # same port, empty
        detected = wait(lambda: all(c.store.epoch.recoveries for c in (a, b)), DETECT_SECONDS, "both replicas recover")
        time.sleep(SETTLE_SECONDS + 1.5)
    finally:
        load.stop.set()
        thread.join(10)
    print_stall(load, restarted_at)
    print(f"restart: recovered on both replicas {time_to_recover([a, b]) - restarted_at:.3f} s after the restart "
          f"(waited {detected:.3f} s); {len(load.refused)} writes refused during the outage")
    assert len(load.acknowledged) > 10
    check_after(a, b, load, counts, make_core)


# -- the protocol, step by step (engines without sync threads: nothing runs by itself) -----------


def engines(settings, bor_policy, url: str, prefix: str, n: int = 2) -> list[Registries]:
    out = []
    for _ in range(n):
        store = RedisStore(connect(url), prefix)
        engine = new_engine(settings, store=store, bor_policy=bor_policy)
        StoreSync(engine.writer, store, settle_seconds=0.5)  # never started: registers what to write back
        out.append(engine)
    return out


def test_a_write_in_the_wipe_window_lands_on_the_held_version(settings, bor_policy, own_redis, redis_prefix):
    a, b = engines(settings, bor_policy, own_redis.url, redis_prefix)
    a.writer.put_registry("r", weather_tools())
    for n in range(6):
        a.writer.upsert_tools("r", [tool(f"t{n}", f"Tool {n}.")])
    b.writer.refresh()
    assert b.snapshots.snapshot("r").version == 7
    own_redis.client().flushall()
    # b writes before anything noticed the wipe: version 8 on top of 7, not version 1 alone
    info = b.writer.upsert_tools("r", [tool("late", "A late tool.")])
    assert info.version == 8 and info.tools == 4 + 6 + 1
    assert [(r.won, r.registries) for r in b.writer.store.epoch.recoveries] == [(True, 1)]
    # a notices at its next poll, re-publishes nothing (the store is not behind it) and follows
    a.writer.refresh()
    assert [(r.won, r.registries) for r in a.writer.store.epoch.recoveries] == [(False, 0)]
    assert a.snapshots.snapshot("r").version == 8 and "late" in a.snapshots.snapshot("r").by_name
    assert b.writer.store.load("r").version == 8
    # the winner re-published the embedding cache too: a replica started now embeds nothing
    snap = b.snapshots.snapshot("r")
    assert set(b.writer.store.get_embeddings(snap.embedder, list(snap.content_hashes))) == set(snap.content_hashes)


def test_a_replica_ahead_of_the_winner_fills_in_and_counters_survive(settings, bor_policy, own_redis, redis_prefix):
    a, b = engines(settings, bor_policy, own_redis.url, redis_prefix)
    a.writer.put_registry("r", weather_tools())
    a.writer.put_registry("gone", [tool("g", "Gone soon.")])
    a.writer.upsert_tools("gone", [tool("h", "Gone too.")])
    b.writer.refresh()
    a.writer.upsert_tools("r", [tool("newest", "Only a has seen this.")])  # a: r v2, b still at v1
    a.writer.delete_registry("gone")  # version counter of "gone": 2, kept for a re-creation
    a.writer.refresh()  # a's last poll saw the counters
    own_redis.client().flushall()
    b.writer.refresh()  # b wins and re-publishes what it holds: r v1, and "gone" (it missed the delete)
    assert [(r.won, r.registries) for r in b.writer.store.epoch.recoveries] == [(True, 2)]
    assert b.writer.store.version("gone") == 2
    a.writer.refresh()  # a holds r v2, newer than the store: re-published; "gone" v2 is older than its delete
    assert [(r.won, r.registries) for r in a.writer.store.epoch.recoveries] == [(False, 1)]
    assert a.snapshots.snapshot("r").version == 2
    b.writer.refresh()
    assert b.snapshots.snapshot("r").version == 2 and "newest" in b.snapshots.snapshot("r").by_name
    # the deleted registry stays deleted and its numbers are not reused
    assert not a.snapshots.has_registry("gone") and not b.snapshots.has_registry("gone")
    assert b.writer.put_registry("gone", [tool("g", "Back.")]).version == 3


def test_writes_wait_until_a_replica_ahead_has_written_back(settings, bor_policy, own_redis, redis_prefix):
    """The winner holds r v1, b holds v2 (its own write, not yet synced by the winner): the
    winner's next write waits for the settling window, so it lands on b's v2, not beside it."""
    a, b = engines(settings, bor_policy, own_redis.url, redis_prefix)
    a.writer.put_registry("r", weather_tools())
    b.writer.refresh()
    b.writer.upsert_tools("r", [tool("from_b", "Written on b just before the wipe.")])
    own_redis.client().flushall()
    a.writer.refresh()  # a wins and writes back r v1
    assert [(r.won, r.registries) for r in a.writer.store.epoch.recoveries] == [(True, 1)]
    result: list = []
    writer = threading.Thread(target=lambda: result.append(a.writer.upsert_tools("r", [tool("from_a", "After.")])))
    writer.start()
    time.sleep(0.1)
    b.writer.refresh()  # b notices within the settling window and writes back its v2
    writer.join(10)
    assert [(r.won, r.registries) for r in b.writer.store.epoch.recoveries] == [(False, 1)]
    assert result and result[0].version == 3
    assert {"from_a", "from_b"} <= set(a.snapshots.snapshot("r").by_name)


def test_a_fresh_store_is_adopted_and_a_second_flush_recovers_again(settings, bor_policy, own_redis, redis_prefix):
    (a,) = engines(settings, bor_policy, own_redis.url, redis_prefix, n=1)
    assert a.writer.load_all() == 0 and a.writer.store.epoch.token is not None  # first use: the epoch is created
    a.writer.put_registry("r", weather_tools())
    for _ in range(2):
        own_redis.client().flushall()
        assert a.writer.store.versions() == {"r": 1}  # the poll itself repairs the store
    assert [r.won for r in a.writer.store.epoch.recoveries] == [True, True]
    assert a.writer.store.load("r").version == 1


def test_an_idle_flush_is_repaired_by_the_poll(make_core, own_redis):
    """No traffic: the sync thread's poll (every second by default) notices and repairs it."""
    a, b = make_core(), make_core()
    seed(a, b)
    wiped_at = time.time()
    own_redis.client().flushall()
    wait(lambda: all(c.writer.store.epoch.recoveries for c in (a, b)), DETECT_SECONDS, "both replicas recover")
    seconds = time_to_recover([a, b]) - wiped_at
    print(f"idle flush: repaired on both replicas {seconds:.3f} s after FLUSHALL (poll every 1 s)")
    assert seconds < a.settings.sync_interval_seconds + 1.0
    assert {i.registry: i.version for i in b.snapshots.list_registries()} == {"r1": 5, "r2": 1}
    assert a.writer.store.versions() == {"r1": 5, "r2": 1}


def test_wiped_again_while_republishing(settings, bor_policy, own_redis, redis_prefix):
    (a,) = engines(settings, bor_policy, own_redis.url, redis_prefix, n=1)
    a.writer.put_registry("r", weather_tools())
    a.writer.upsert_tools("r", [tool("extra", "An extra tool.")])
    store = a.writer.store
    assert isinstance(store, RedisStore)
    held = store._held
    flushes = []

    def flush_once_then_held():
        if not flushes:
            flushes.append(1)
            own_redis.client().flushall()  # a second wipe in the middle of the re-publish
        return held()

    store.set_republish_source(flush_once_then_held)
    own_redis.client().flushall()
    assert store.versions() == {"r": 2}
    assert flushes == [1] and [r.won for r in store.epoch.recoveries] == [True]
    assert store.load("r").version == 2 and a.writer.upsert_tools("r", [tool("more", "More.")]).version == 3


def test_a_store_restarted_from_an_older_snapshot_goes_forward_again(settings, bor_policy, own_redis, redis_prefix):
    """Redis restarted from an RDB snapshot older than the last writes: its epoch is intact, but
    it lost versions (and a registry created after the snapshot). The replicas write them back
    instead of following the store backwards."""
    a, b = engines(settings, bor_policy, own_redis.url, redis_prefix)
    a.writer.put_registry("r", weather_tools())
    a.writer.refresh()
    b.writer.refresh()
    own_redis.client().save()  # the snapshot: r v1
    a.writer.upsert_tools("r", [tool("after_snapshot", "Written after the snapshot.")])  # r v2
    a.writer.put_registry("young", [tool("y", "Created after the snapshot.")])
    b.writer.refresh()
    assert b.snapshots.snapshot("r").version == 2 and b.snapshots.has_registry("young")
    own_redis.stop()
    own_redis.start()  # loads dump.rdb: r v1, no "young"
    assert b.writer.store.load("r").version == 2  # b's first call noticed and wrote back
    assert b.writer.store.epoch.recoveries == [] and len(b.writer.store.epoch.catch_ups) == 1
    assert b.writer.store.versions() == {"r": 2, "young": 1}
    info = a.writer.upsert_tools("r", [tool("later", "After the restart.")])
    assert info.version == 3 and {"after_snapshot", "later"} <= set(a.snapshots.snapshot("r").by_name)
    b.writer.refresh()
    assert b.snapshots.snapshot("r").version == 3 and b.snapshots.has_registry("young")
