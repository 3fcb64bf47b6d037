"""The Redis backends against a real redis-server: registries and versions, the embedding cache,
remembered shortlists, the feedback stream, replicas (engines) kept in step, and outages."""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import pytest

from registry.assembly import Registries
from registry.errors import ShortlistNotFound, StoreUnavailable, VersionConflict
from registry.feedback import (
    EquivalenceClasses,
    FeedbackEvent,
    FeedbackRecorder,
    FeedbackRequest,
    LiveWindow,
    RememberedShortlists,
    SharedFeedbackLog,
    ShownShortlist,
    ToolEfficiency,
)
from registry.index.embed import HashingEmbedder
from registry.request import ShortlistRequest
from registry.store.base import RegistryRecord, SharedStore
from registry.store.redis import (
    RedisFeedbackLog,
    RedisShortlistMemory,
    RedisStore,
    StoreHealth,
    connect,
)
from registry.writes.sync import StoreSync
from tests.conftest import CountingEmbedder, weather_tools
from tests.cores import new_engine
from tests.redis_server import RedisServer


@pytest.fixture
def client(redis_server):
    c = connect(redis_server.url)
    yield c
    c.close()


@pytest.fixture
def store(client, redis_prefix) -> RedisStore:
    return RedisStore(client, redis_prefix)


def record(name: str, version: int, n: int = 3) -> RegistryRecord:
    return RegistryRecord(name, version, [{"name": f"t{i}", "v": version} for i in range(n)])


def replica(settings, bor_policy, url: str, prefix: str, embedder=None) -> Registries:
    """One engine on its own Redis connection: what one service replica holds."""
    return new_engine(settings, store=RedisStore(connect(url), prefix), embedder=embedder, bor_policy=bor_policy)


def tool(name: str, text: str) -> dict:
    return {"name": name, "description": text, "parameters": {"type": "object", "properties": {}}}


# -- registries and versions ---------------------------------------------------------------------


def test_roundtrip_versions_and_delete(store, client, redis_prefix):
    assert isinstance(store, SharedStore)
    assert store.list_registries() == [] and store.load("a") is None and store.version("a") is None
    store.save(record("a", 1))
    store.save(record("a", 2, n=5))
    store.save(record("b", 1))
    loaded = store.load("a")
    assert loaded == record("a", 2, n=5)
    assert store.list_registries() == ["a", "b"]
    assert store.versions() == {"a": 2, "b": 1} and store.version("a") == 2
    for v in range(3, 6):
        store.save(record("a", v))
    # Only the newest two versions are kept, like the local store.
    assert sorted(int(k) for k in client.hkeys(f"{redis_prefix}registry:a")) == [4, 5]

    assert store.delete("a") is True and store.delete("a") is False
    assert store.load("a") is None and store.list_registries() == ["b"]
    assert client.exists(f"{redis_prefix}registry:a") == 0
    # Version numbers are never reused: a re-created registry continues after the deleted one.
    with pytest.raises(VersionConflict) as info:
        store.save(record("a", 1))
    assert info.value.latest == 5
    store.save(record("a", 6))
    assert store.load("a").version == 6


def test_a_version_is_assigned_once(store):
    store.save(record("a", 1))
    for bad in (1, 3):
        with pytest.raises(VersionConflict) as info:
            store.save(record("a", bad, n=9))
        assert info.value.latest == 1
        assert info.value.error_type == "conflict"
    assert store.load("a") == record("a", 1)


def test_concurrent_writers_never_share_a_version(redis_server, redis_prefix):
    """Eight writers (own connections, like replicas) race on one registry: every version is
    assigned to exactly one of them, the sequence has no gap, and a reader that loads while they
    write only ever sees complete records."""
    writers, per_writer = 8, 15
    accepted: list[tuple[int, int]] = []
    torn: list[RegistryRecord] = []
    lock = threading.Lock()
    done = threading.Event()
    start = threading.Barrier(writers + 1)

    def write(w: int) -> None:
        s = RedisStore(connect(redis_server.url), redis_prefix)
        start.wait()
        mine = 0
        while mine < per_writer:
            version = (s.version("race") or 0) + 1
            tools = [{"name": f"w{w}-t{i}", "v": version, "w": w} for i in range(50)]
            try:
                s.save(RegistryRecord("race", version, tools))
            except VersionConflict:
                continue
            with lock:
                accepted.append((version, w))
            mine += 1

    def read() -> None:
        s = RedisStore(connect(redis_server.url), redis_prefix)
        start.wait()
        while not done.is_set():
            r = s.load("race")
            if r is not None and (
                len(r.tools) != 50 or {(t["v"], t["w"]) for t in r.tools} != {(r.version, r.tools[0]["w"])}
            ):
                torn.append(r)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    reader = threading.Thread(target=read)
    for t in (*threads, reader):
        t.start()
    for t in threads:
        t.join(60)
    done.set()
    reader.join(10)
    versions = Counter(v for v, _ in accepted)
    assert sorted(versions) == list(range(1, writers * per_writer + 1))
    assert set(versions.values()) == {1}
    assert not torn
    last_version, last_writer = max(accepted)
    final = RedisStore(connect(redis_server.url), redis_prefix).load("race")
    assert final.version == last_version and final.tools[0]["w"] == last_writer


def test_embedding_cache(store):
    vectors = {f"{i:064x}": np.full(8, i, dtype=np.float32) for i in range(5000)}
    store.put_embeddings("model-x", vectors)
    found = store.get_embeddings("model-x", [*vectors, "f" * 64])
    assert set(found) == set(vectors)
    assert np.array_equal(found[f"{4321:064x}"], np.full(8, 4321, dtype=np.float32))
    assert found[f"{1:064x}"].dtype == np.float32
    assert store.get_embeddings("model-y", list(vectors)[:10]) == {}


# -- remembered shortlists -----------------------------------------------------------------------


def shown(shortlist_id: str, created: float | None = None) -> ShownShortlist:
    return ShownShortlist(
        shortlist_id, "r", 3, 10, 2, ("get_weather", "send_email"), created or time.time()
    )


def test_memory_roundtrip_and_feedback_mark_across_replicas(client, redis_server, redis_prefix):
    a = RedisShortlistMemory(client, 60, redis_prefix)
    b = RedisShortlistMemory(connect(redis_server.url), 60, redis_prefix)
    assert isinstance(a, RememberedShortlists)
    a.remember(shown("s1"))
    assert b.get("s1") == a.get("s1")
    assert b.get("s1").shown == ("get_weather", "send_email")
    assert 0 < client.pttl(f"{redis_prefix}shown:s1") <= 60_000
    assert a.mark_feedback("s1") is True
    assert b.mark_feedback("s1") is False  # a resend to another replica is still a resend
    # The mark expires with the shortlist it belongs to.
    assert 0 < client.pttl(f"{redis_prefix}feedback-mark:s1") <= 60_000
    b.unmark_feedback("s1")
    assert a.mark_feedback("s1") is True
    with pytest.raises(ShortlistNotFound):
        a.mark_feedback("never-served")
    assert a.get("never-served") is None


def test_memory_ttl(client, redis_prefix):
    memory = RedisShortlistMemory(client, 0.3, redis_prefix)
    memory.remember(shown("old", created=time.time() - 1))  # already past retention: not stored
    memory.remember(shown("s"))
    assert memory.get("old") is None and memory.get("s") is not None
    time.sleep(0.45)
    assert memory.get("s") is None
    with pytest.raises(ShortlistNotFound):
        memory.mark_feedback("s")


# -- the feedback stream -------------------------------------------------------------------------


def event(i: int, registry: str = "r") -> FeedbackEvent:
    return FeedbackEvent(
        shortlist_id=f"s{i}", registry=registry, version=1, n_tools=10, k=2,
        shown=("a", "b"), used=("a",), success=True, calls=(), presented_exact=True,
        presented_equivalent=True, p_rand_exact=0.2, p_rand_equivalent=0.2, received=1000.0 + i,
    )


def test_stream_log_replay_and_tail(client, redis_server, redis_prefix):
    a = RedisFeedbackLog(client, redis_prefix)
    b = RedisFeedbackLog(connect(redis_server.url), redis_prefix)
    assert isinstance(a, SharedFeedbackLog)
    for i in range(2500):  # more than one XRANGE page
        a.append(event(i))
    replayed = list(b.replay())
    assert [e.shortlist_id for e in replayed] == [f"s{i}" for i in range(2500)]
    assert replayed[7] == event(7)
    # b tails what a appends; a never reads its own events back.
    seen = []
    while batch := b.read_new():
        seen += batch
    assert len(seen) == 2500 and b.read_new() == []
    assert a.read_new() == []
    b.append(event(9000))
    a.append(event(9001))
    assert [e.shortlist_id for e in a.read_new()] == ["s9000"]
    assert [e.shortlist_id for e in b.read_new()] == ["s9001"]
    client.xadd(a.stream, {"event": "{not json", "origin": "x"})
    assert a.read_new() == [] and a.skipped == 1


def test_recorder_catch_up_counts_other_replicas_once(client, redis_server, redis_prefix):
    def recorder(c):
        return FeedbackRecorder(
            RedisShortlistMemory(c, 60, redis_prefix), RedisFeedbackLog(c, redis_prefix),
            LiveWindow(3600, clock=lambda: 1000.0), ToolEfficiency(),
        )

    a, b = recorder(client), recorder(connect(redis_server.url))
    for i in range(3):
        a.remember(shown(f"s{i}"))
    for i in range(3):
        a.submit(FeedbackRequest(f"s{i}", ["get_weather"], [{"tool": "get_weather", "useful": True}], True),
                 known_tools=lambda r: {"get_weather", "send_email"},
                 equivalence=lambda r: EquivalenceClasses())
    assert b.restore() == 3  # a fresh replica replays the stream
    assert b.catch_up() == 0 and a.catch_up() == 0  # nothing new; a's own events are not recounted
    assert a.efficiency.report("r") == b.efficiency.report("r")
    assert b.efficiency.report("r")["events"] == 3


# -- replicas in step ----------------------------------------------------------------------------


def test_replicas_refresh_install_and_drop(settings, bor_policy, redis_server, redis_prefix):
    embedder_b = CountingEmbedder(HashingEmbedder())
    a = replica(settings, bor_policy, redis_server.url, redis_prefix)
    b = replica(settings, bor_policy, redis_server.url, redis_prefix, embedder_b)
    seen = []
    b.writer.add_listener(seen.append)
    a.writer.put_registry("w", weather_tools())
    assert b.writer.load_all() == 1
    assert b.snapshots.snapshot("w").version == 1
    info = a.writer.upsert_tools("w", [tool("book_flight", "Book a flight between two airports.")])
    assert b.writer.refresh()[0].info == info
    assert [c.info.version for c in seen] == [2]
    assert embedder_b.documents == 0  # b reused the embeddings a cached in Redis
    query = "what is the weather in Paris"
    assert [t.name for t in b.shortlist(ShortlistRequest("w", query, k=3)).tools] == [
        t.name for t in a.shortlist(ShortlistRequest("w", query, k=3)).tools
    ]
    assert b.writer.refresh() == []
    a.writer.delete_registry("w")
    (change,) = b.writer.refresh()
    assert change.info is None and not b.snapshots.has_registry("w") and seen[-1] == change


def test_a_lagging_replica_writes_on_top_of_the_newest_version(settings, bor_policy, redis_server, redis_prefix):
    a = replica(settings, bor_policy, redis_server.url, redis_prefix)
    b = replica(settings, bor_policy, redis_server.url, redis_prefix)
    a.writer.put_registry("w", weather_tools())
    b.writer.load_all()
    a.writer.upsert_tools("w", [tool("from_a", "Added on replica a.")])
    # b has not refreshed: its upsert catches up first, so a's tool is not lost.
    info = b.writer.upsert_tools("w", [tool("from_b", "Added on replica b.")])
    assert info.version == 3
    assert {"from_a", "from_b", "get_weather", "send_email"} <= set(b.snapshots.snapshot("w").by_name)
    assert a.writer.refresh()[0].info == info
    # Deleting on a replica that has not seen the registry yet still works.
    a.writer.put_registry("fresh", weather_tools())
    b.writer.delete_registry("fresh")
    assert a.writer.store.load("fresh") is None
    # Re-created after a delete: the version continues, so no replica confuses the two.
    assert a.writer.put_registry("fresh", weather_tools()).version == 2


def test_racing_replicas_lose_no_update(settings, bor_policy, redis_server, redis_prefix):
    engines = [replica(settings, bor_policy, redis_server.url, redis_prefix) for _ in range(3)]
    engines[0].writer.put_registry("race", weather_tools())
    for e in engines[1:]:
        e.writer.load_all()
    errors = []

    def add(e: Registries, i: int) -> None:
        try:
            for j in range(4):
                e.writer.upsert_tools("race", [tool(f"tool_{i}_{j}", f"Tool number {i} {j}.")])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(e, i)) for i, e in enumerate(engines)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    engines[0].writer.refresh()
    final = engines[0].snapshots.snapshot("race")
    assert {f"tool_{i}_{j}" for i in range(3) for j in range(4)} <= set(final.by_name)
    assert final.n_tools == 4 + 12 and final.version == 1 + 12


def test_sync_thread_follows_notifications_and_polls(settings, bor_policy, redis_server, redis_prefix):
    a = replica(settings, bor_policy, redis_server.url, redis_prefix)
    b = replica(settings, bor_policy, redis_server.url, redis_prefix)
    a.writer.put_registry("w", weather_tools())
    b.writer.load_all()
    # A 30 s poll: only the pub/sub notification can make b catch up quickly.
    sync = StoreSync(b.writer, b.writer.store, interval=30)
    sync.start()
    try:
        time.sleep(0.2)  # let it subscribe
        started = time.monotonic()
        a.writer.upsert_tools("w", [tool("book_flight", "Book a flight.")])
        while b.snapshots.snapshot("w").version != 2:
            assert time.monotonic() - started < 2, "notification not delivered"
            time.sleep(0.01)
    finally:
        sync.stop()
    # A write whose notification is lost (published elsewhere) is caught by the poll.
    silent = RedisStore(connect(redis_server.url), redis_prefix)
    silent.channel = f"{redis_prefix}elsewhere"
    silent.save(RegistryRecord("w", 3, [tool("only", "The only tool.")]))
    sync = StoreSync(b.writer, b.writer.store, interval=0.2)
    sync.start()
    try:
        started = time.monotonic()
        while b.snapshots.snapshot("w").version != 3:
            assert time.monotonic() - started < 2, "poll did not catch up"
            time.sleep(0.01)
    finally:
        sync.stop()
    assert [t.name for t in b.snapshots.snapshot("w").tools] == ["only"]


# -- outages -------------------------------------------------------------------------------------


@pytest.fixture
def own_redis(tmp_path):
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    yield server
    server.stop()


def test_outage_reads_keep_working_writes_fail_then_resync(settings, bor_policy, own_redis, redis_prefix):
    health = StoreHealth()
    client = connect(own_redis.url)
    store = RedisStore(client, redis_prefix, health)
    memory = RedisShortlistMemory(client, 60, redis_prefix, health)
    feedback_log = RedisFeedbackLog(client, redis_prefix, health)
    a = new_engine(settings, store=store, bor_policy=bor_policy)
    b = replica(settings, bor_policy, own_redis.url, redis_prefix)
    a.writer.put_registry("w", weather_tools())
    b.writer.load_all()
    sync = StoreSync(b.writer, b.writer.store, interval=0.2)
    sync.start()
    try:
        own_redis.stop()
        before = a.shortlist(ShortlistRequest("w", "weather in Paris", k=2))
        with pytest.raises(StoreUnavailable) as info:
            a.writer.upsert_tools("w", [tool("x", "Another tool.")])
        assert "unavailable" in info.value.message and info.value.error_type == "unavailable"
        assert not health.up
        with pytest.raises(StoreUnavailable):
            a.writer.delete_registry("w")
        assert a.snapshots.snapshot("w").version == 1  # nothing changed locally either
        memory.remember(shown("s-down"))  # held in memory, never raises on the query path
        assert memory.pending_shortlists() == 1 and memory.dropped == 0
        assert memory.get("s-down") is not None  # known here, not yet in Redis
        with pytest.raises(StoreUnavailable):
            memory.mark_feedback("s-down")  # feedback during the outage: 503, retry later
        with pytest.raises(StoreUnavailable):
            memory.get("s-never-seen")
        with pytest.raises(StoreUnavailable):
            feedback_log.append(event(1))
        with pytest.raises(StoreUnavailable):
            a.writer.refresh()
        deadline = time.monotonic() + 3
        while sync.up:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert [t.name for t in b.shortlist(ShortlistRequest("w", "weather in Paris", k=2)).tools] == [
            t.name for t in before.tools
        ]

        own_redis.start()  # same port, same data (append-only file)
        info2 = a.writer.upsert_tools("w", [tool("x", "Another tool.")])
        assert info2.version == 2 and health.up
        deadline = time.monotonic() + 3
        while b.snapshots.snapshot("w").version != 2:
            assert time.monotonic() < deadline, "replica did not resynchronise"
            time.sleep(0.05)
        assert sync.up
        memory.remember(shown("s-up"))
        assert memory.get("s-up") is not None
        # the shortlist served during the outage reaches Redis: any replica accepts its feedback
        memory.flush_pending()
        assert memory.pending_shortlists() == 0
        other = RedisShortlistMemory(connect(own_redis.url), 60, redis_prefix)
        assert other.get("s-down").shown == shown("s-down").shown
        assert other.mark_feedback("s-down") is True and memory.mark_feedback("s-down") is False
    finally:
        sync.stop()


def test_failed_unmark_is_retried_before_the_next_mark(client, own_redis, redis_prefix):
    memory = RedisShortlistMemory(connect(own_redis.url), 60, redis_prefix)
    memory.remember(shown("s"))
    assert memory.mark_feedback("s") is True
    own_redis.stop()
    memory.unmark_feedback("s")  # the log append failed and so does the unmark: kept for later
    own_redis.start()
    assert memory.mark_feedback("s") is True  # the retry is accepted, not taken for a resend


# -- settings choose the backend -----------------------------------------------------------------


def test_settings_choose_the_backend(tmp_path, bor_policy, redis_server, redis_prefix):
    from registry.feedback import LocalFeedbackLog, ShortlistMemory
    from registry.store.local import LocalStore
    from service.settings import ServiceSettings
    from service.state import ServiceState

    local = ServiceState(ServiceSettings(data_dir=tmp_path / "local", demo_registry=None), bor_policy=bor_policy)
    assert isinstance(local.core.store, LocalStore)
    assert isinstance(local.feedback.memory, ShortlistMemory)
    assert isinstance(local.feedback.log, LocalFeedbackLog)

    settings = ServiceSettings(
        data_dir=tmp_path / "shared", demo_registry=None,
        redis_url=redis_server.url, redis_prefix=redis_prefix, sync_interval_seconds=0.5,
    )
    assert redis_server.url not in repr(settings)  # the URL may hold a password
    shared = ServiceState(settings, bor_policy=bor_policy)
    assert isinstance(shared.core.store, RedisStore) and shared.core.store.prefix == redis_prefix
    assert isinstance(shared.feedback.memory, RedisShortlistMemory)
    assert isinstance(shared.feedback.log, RedisFeedbackLog)
    assert not (tmp_path / "shared").exists()  # nothing is written locally in Redis mode
    shared.close()


def test_replicas_racing_to_create_a_registry_make_one_version(settings, bor_policy, redis_server, redis_prefix):
    """The demo registry at start-up: every replica tries to create it, exactly one does."""
    engines = [replica(settings, bor_policy, redis_server.url, redis_prefix) for _ in range(4)]
    tools = weather_tools()
    results: list = [None] * len(engines)
    barrier = threading.Barrier(len(engines))

    def create(i: int) -> None:
        barrier.wait()
        results[i] = engines[i].writer.create_registry("demo", tools)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(len(engines))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    created = [r for r in results if r is not None]
    assert len(created) == 1 and created[0].version == 1
    assert engines[0].writer.store.version("demo") == 1
    assert engines[1].writer.create_registry("demo", tools) is None


def test_outage_buffer_is_bounded_and_skips_expired(client, redis_prefix):
    now = [1000.0]
    health = StoreHealth()
    memory = RedisShortlistMemory(client, 60, redis_prefix, health, clock=lambda: now[0], max_pending=3)
    health.up = False
    for i in range(5):
        memory.remember(ShownShortlist(f"b{i}", "r", 1, 10, 2, ("a", "b"), now[0] - 50 * (i == 0)))
    assert memory.pending_shortlists() == 3 and memory.dropped == 2  # b0, b1 dropped (oldest)
    now[0] += 30
    health.up = True
    memory.flush_pending()
    assert memory.pending_shortlists() == 0
    assert [memory.get(f"b{i}") is not None for i in range(5)] == [False, False, True, True, True]
    ttl = client.pttl(memory._shown_key("b2"))
    assert 0 < ttl <= 30_000  # the remaining retention, not a fresh one


def test_a_write_from_a_stale_view_of_absence_never_overwrites(settings, bor_policy, redis_server, redis_prefix):
    """B decides "the registry does not exist" (its sync ran just before A created it), then
    upserts: it must notice A's version and merge into it, not replace it."""
    a = replica(settings, bor_policy, redis_server.url, redis_prefix)
    b = replica(settings, bor_policy, redis_server.url, redis_prefix)
    real_sync = b.writer.commits.sync_locked
    calls: list[str] = []

    def stale_first_sync(registry: str):
        calls.append(registry)
        if len(calls) == 1:
            a.writer.put_registry("r", weather_tools())  # lands right after B's (empty) sync
            return None
        return real_sync(registry)

    b.writer.commits.sync_locked = stale_first_sync
    b.writer.upsert_tools("r", [tool("x", "Another tool.")])
    names = sorted(t.name for t in b.snapshots.snapshot("r").tools)
    assert names == sorted([t.name for t in a.snapshots.snapshot("r").tools] + ["x"])
    assert b.snapshots.snapshot("r").version == 2 and len(calls) >= 2


def test_replicas_share_one_caller_key_kept_in_redis(settings, bor_policy, redis_server, redis_prefix, make_core):
    """Caller hashes are HMACs under a key every replica reads from Redis (set once, NX), so a
    token is one caller on every replica; a key set by the operator wins."""
    from pydantic import SecretStr

    url = SecretStr(redis_server.url)
    a = make_core(redis_url=url, redis_prefix=redis_prefix)
    b = make_core(redis_url=url, redis_prefix=redis_prefix, data_dir=settings.data_dir / "b")
    assert a.caller_key() == b.caller_key() and len(a.caller_key()) == 32
    assert connect(redis_server.url).get(redis_prefix + "caller-key") == a.caller_key()
    own = make_core(redis_url=url, redis_prefix=redis_prefix, caller_key=SecretStr("set-by-operator"))
    assert own.caller_key() == b"set-by-operator"


def test_graph_edits_replicate_and_a_lagging_replica_keeps_them(settings, bor_policy, redis_server, redis_prefix):
    from tests.test_graph import REST

    a = replica(settings, bor_policy, redis_server.url, redis_prefix)
    b = replica(settings, bor_policy, redis_server.url, redis_prefix)
    a.writer.put_registry("shop", REST)
    b.writer.load_all()
    a.writer.edit_graph("shop", add=[["get_customer", "get_order"]], remove=[["search_films", "get_film"]])
    b.writer.refresh()
    assert b.snapshots.snapshot("shop").graph.edges == a.snapshots.snapshot("shop").graph.edges
    assert b.snapshots.snapshot("shop").edits.added == (("get_customer", "get_order"),)
    b.writer.upsert_tools("shop", [tool("cancel_order", "Cancel an order.")])  # written on top, edits kept
    a.writer.refresh()
    assert a.snapshots.snapshot("shop").version == 3 and a.snapshots.snapshot("shop").edits == b.snapshots.snapshot("shop").edits
