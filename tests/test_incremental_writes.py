"""Incremental writes (issue 14 item 9): a version is derived from the previous one, embedding
and tokenising only new text, and serves exactly like a snapshot built from scratch."""

from __future__ import annotations

import random

import numpy as np
import pytest

from registry.errors import InvalidToolDefinition, PayloadTooLarge
from registry.index.dense import DenseIndex
from registry.index.hybrid import SCORERS, Query
from registry.index.lexical import LexicalIndex, tokenize
from registry.index.snapshot import build_snapshot
from registry.job_queue import LocalJobRecords
from registry.request import ShortlistRequest
from registry.store.local import LocalStore
from registry.tools import ToolLimits, parse_tools
from registry.writes.prepared import stored_tools
from registry.writes.write_jobs import WriteJobs
from tests.cores import new_engine

WORDS = "invoice order flight hotel payment report user zebra weather stock ticket email calendar".split()
QUERIES = ["book a flight and hotel", "zebra weather report", "send an email about the invoice",
           "order order payment", "calendar", "nothing matches xyzzy"]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9)))


def _tool(name: str, rng: random.Random) -> dict:
    return {"name": name, "description": _text(rng)}


def test_lexical_update_scores_exactly_like_a_rebuild_through_many_changes():
    rng = random.Random(7)
    texts = [_text(rng) for _ in range(60)]
    index = LexicalIndex(texts)
    compacted = False
    for step in range(80):
        new = list(texts)
        action = step % 4
        if action == 0 and len(new) > 5:
            del new[rng.randrange(len(new))]  # delete
        elif action == 1:
            new[rng.randrange(len(new))] = _text(rng)  # change
        elif action == 2:
            new.append(_text(rng))  # add
        else:
            new.append(new[rng.randrange(len(new))])  # a duplicate text gets its own slot
        position = {t: i for i, t in enumerate(texts)}
        reuse = np.array([position.get(t, -1) for t in new])
        derived = LexicalIndex.updated(index, new, reuse)
        rebuilt = LexicalIndex(new)
        compacted |= derived.dead_slots == 0 and index.dead_slots > 0
        for query in QUERIES:
            tokens = tokenize(query)
            assert np.array_equal(derived.scores(tokens), rebuilt.scores(tokens)), (step, query)
            assert derived.ceiling(tokens) == pytest.approx(rebuilt.ceiling(tokens), abs=1e-12)
        index, texts = derived, new
    assert compacted  # dead slots were folded away at least once


def test_lexical_update_leaves_the_previous_index_untouched():
    index = LexicalIndex(["alpha beta", "gamma"])
    before = index.scores(["alpha", "gamma"]).copy()
    LexicalIndex.updated(index, ["alpha beta", "alpha alpha delta"], np.array([0, -1]))
    assert np.array_equal(index.scores(["alpha", "gamma"]), before)
    with pytest.raises(ValueError):
        LexicalIndex.updated(index, ["x"], np.array([5]))


def test_derived_snapshot_ranks_like_a_rebuilt_one_and_embeds_only_new_text(tmp_path, hashing_embedder):
    rng = random.Random(3)
    store = LocalStore(tmp_path)
    tools = parse_tools([_tool(f"t{i}", rng) for i in range(80)])
    first = build_snapshot("r", 1, tools, hashing_embedder, store, hnsw_min_tools=10**6)
    hashing_embedder.documents = 0
    changed = [*tools[:10], *tools[11:]]  # one deleted
    changed[20] = parse_tools([{"name": changed[20].name, "description": "a brand new zebra text"}])[0]
    changed += parse_tools([_tool("added", rng)])
    derived = build_snapshot("r", 2, changed, hashing_embedder, store, hnsw_min_tools=10**6, previous=first)
    assert hashing_embedder.documents == 2  # the changed tool and the added one
    rebuilt = build_snapshot("r", 2, changed, hashing_embedder, store, hnsw_min_tools=10**6)
    assert np.array_equal(derived.dense.embeddings, rebuilt.dense.embeddings)
    for text in QUERIES:
        query = Query(hashing_embedder.embed_query(text), tokenize(text))
        for scorer in SCORERS.values():
            got = scorer.rank(query, derived.dense, derived.lexical, 10)
            want = scorer.rank(query, rebuilt.dense, rebuilt.lexical, 10)
            assert np.array_equal(got[0], want[0]) and np.allclose(got[1], want[1]), (text, scorer)
    assert derived.by_name == rebuilt.by_name and derived.names.find("`added`") == [len(changed) - 1]
    assert first.n_tools == 80 and first.lexical.scores(["zebra"]).shape == (80,)  # untouched


def test_one_tool_upsert_embeds_one_text_and_shares_unchanged_parts(settings, hashing_embedder, bor_policy):
    engine = new_engine(settings, embedder=hashing_embedder, bor_policy=bor_policy)
    rng = random.Random(1)
    engine.writer.put_registry("r", {"tools": [_tool(f"t{i}", rng) for i in range(50)], "equivalents": [["t1", "t2"]]})
    before = engine.snapshots.snapshot("r")
    hashing_embedder.documents = 0
    engine.writer.upsert_tools("r", [{"name": "t3", "description": "counts zebras"}])
    after = engine.snapshots.snapshot("r")
    assert hashing_embedder.documents == 1
    assert after.names is before.names and after.equivalence is before.equivalence  # shared
    assert after.tools[3].description == "counts zebras" and after.version == before.version + 1
    assert engine.shortlist(ShortlistRequest("r", "count the zebras", k=1)).tools[0].name == "t3"
    engine.writer.delete_tool("r", "t3")
    assert "t3" not in engine.snapshots.snapshot("r").by_name and hashing_embedder.documents == 1


def test_stored_tools_reuses_parsed_tools_and_matches_the_parser(settings, hashing_embedder, bor_policy):
    engine = new_engine(settings, embedder=hashing_embedder, bor_policy=bor_policy)
    rng = random.Random(2)
    definitions = [_tool(f"t{i}", rng) for i in range(20)]
    definitions.append({"type": "function", "function": {"name": "openai_style", "description": "x"}})
    engine.writer.put_registry("r", definitions)
    current = engine.snapshots.snapshot("r")
    stored = [*definitions[:5], *definitions[6:], {"name": "fresh", "description": "new"}]
    stored[0] = {"name": "t0", "description": "changed"}
    limits = ToolLimits()
    got = stored_tools(stored, current, limits)
    assert [t.definition for t in got] == [t.definition for t in parse_tools(stored, limits)]
    assert got[1] is current.tools[1] and got[-2] is current.tools[-1]  # reused, not reparsed
    assert got[0] is not current.tools[0]
    with pytest.raises(InvalidToolDefinition):  # a duplicate name is still refused
        stored_tools([*stored, {"name": "t1", "description": "again"}], current, limits)
    with pytest.raises(PayloadTooLarge):
        stored_tools(stored, current, ToolLimits(max_tools=3))


def test_write_jobs_report_done_and_failed(settings, hashing_embedder, bor_policy):
    engine = new_engine(settings, embedder=hashing_embedder, bor_policy=bor_policy)
    jobs = WriteJobs(LocalJobRecords(settings.data_dir))
    ok = jobs.submit(engine.writer.prepare_put("r", [{"name": "a", "description": "alpha"}]), "put", [{"name": "a", "description": "alpha"}])
    assert ok.new_texts == 1
    assert jobs.wait(ok, 10) and ok.state == "done" and ok.info.version == 1
    assert jobs.get("r", ok.id).info == ok.info and jobs.get("other", ok.id) is None
    engine.writer.limits = ToolLimits(max_tools=2)
    two = [{"name": "b", "description": "b"}, {"name": "c", "description": "c"}]
    bad = jobs.submit(engine.writer.prepare_upsert("r", two), "upsert", two)
    assert jobs.wait(bad, 10) and bad.state == "failed" and bad.error.error_type == PayloadTooLarge.error_type
    assert engine.snapshots.snapshot("r").n_tools == 1


def test_dense_flat_index_update_matches_a_rebuild():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(30, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    first = DenseIndex(vectors, hnsw_min_tools=1000)
    reuse = np.array([*range(1, 30), -1])
    new = np.concatenate([vectors[1:], vectors[:1] * -1])
    derived = DenseIndex.updated(first, new, reuse, hnsw_min_tools=1000)
    ids, scores = derived.search(new[3], 5)
    want_ids, want_scores = DenseIndex(new, hnsw_min_tools=1000).search(new[3], 5)
    assert np.array_equal(ids, want_ids) and np.allclose(scores, want_scores)


def _poll(client, location: str) -> dict:
    import time

    deadline = time.monotonic() + 30
    while True:
        body = client.get(location).json()
        if body["state"] in ("done", "failed") or time.monotonic() > deadline:
            return body
        time.sleep(0.02)


def test_a_large_upload_answers_202_with_a_job_and_small_ones_stay_synchronous(make_client):
    tools = [{"name": f"t{i}", "description": f"does thing {i}"} for i in range(12)]
    with make_client(async_write_min_texts=5) as client:
        bad = client.put("/registries/big", json=[*tools, {"name": "t1", "description": "dup"}])
        assert bad.status_code == 422  # refused before anything is accepted
        r = client.put("/registries/big", json=tools)
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["state"] in ("queued", "running", "done") and job["new_texts"] == 12
        assert r.headers["location"] == f"/registries/big/jobs/{job['job']}"
        done = _poll(client, r.headers["location"])
        assert done["state"] == "done" and done["result"]["version"] == 1 and done["result"]["tools"] == 12
        assert client.get("/registries/big").json()["version"] == 1
        small = client.post("/registries/big/tools", json=[*tools[:3], {"name": "new", "description": "x"}])
        assert small.status_code == 200 and small.json()["version"] == 2  # one new text
        # re-uploading texts the store has cached embeds nothing: synchronous
        again = client.put("/registries/copy", json=tools)
        assert again.status_code == 200 and again.json()["tools"] == 12
        assert client.get("/registries/big/jobs/nope").status_code == 404
        assert client.get(f"/registries/other/jobs/{job['job']}").status_code == 404


def test_a_failed_job_reports_the_domain_error(make_client):
    with make_client(async_write_min_texts=2, max_tools_per_registry=4) as client:
        assert client.put("/registries/r", json=[{"name": "a", "description": "a"}]).status_code == 200
        r = client.post("/registries/r/tools", json=[{"name": f"n{i}", "description": f"n {i}"} for i in range(4)])
        assert r.status_code == 202
        failed = _poll(client, r.headers["location"])
        assert failed["state"] == "failed" and failed["error"]["type"] == "payload_too_large"
        assert client.get("/registries/r").json()["version"] == 1


def test_queued_writes_commit_together_and_keep_their_own_errors(settings, hashing_embedder, bor_policy):
    import threading
    import time

    from registry.errors import ToolNotFound

    store = LocalStore(settings.data_dir)
    saves = []
    real_save = store.save

    def slow_save(record):  # writers pile up behind the lock meanwhile
        time.sleep(0.05)
        saves.append(record.version)
        real_save(record)

    store.save = slow_save
    engine = new_engine(settings, store=store, embedder=hashing_embedder, bor_policy=bor_policy)
    engine.writer.put_registry("r", [{"name": "seed", "description": "seed"}])
    results, errors = {}, {}

    def write(i: int) -> None:
        try:
            if i == 5:
                results[i] = engine.writer.delete_tool("r", "missing")
            else:
                results[i] = engine.writer.upsert_tools("r", [{"name": f"t{i}", "description": f"tool {i}"}])
        except ToolNotFound as exc:
            errors[i] = exc

    threads = [threading.Thread(target=write, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = engine.snapshots.snapshot("r")
    assert set(errors) == {5} and len(results) == 11
    assert sorted(snap.by_name) == sorted(["seed", *(f"t{i}" for i in range(12) if i != 5)])
    assert len(saves) < 12  # grouped: fewer versions than writes
    assert all(1 < info.version <= snap.version for info in results.values())
    assert snap.version == 1 + len(saves) - 1 and store.load("r").version == snap.version


def test_name_index_extended_finds_appended_names_and_leaves_the_original():
    from registry.index.named_tools import NameIndex

    names = ["get_weather", "search", "yahoo.get_ticker_info"]
    base = NameIndex(names)
    more = ["bing.get_ticker_info", "send_email", "search"]
    extended = base.extended(more, len(names))
    rebuilt = NameIndex(names + more)
    for text in ["get_ticker_info now", "`search` it", "send_email and get_weather", "nothing"]:
        assert extended.find(text) == rebuilt.find(text), text
    assert base.find("get_ticker_info") == [2] and base.find("send_email") == []


def test_the_python_client_waits_for_a_202_upload_and_raises_a_failed_one(make_client):
    from tool_shortlist_client import ShortlistClient
    from tool_shortlist_client.errors import PayloadTooLargeError

    tools = [{"name": f"t{i}", "description": f"does thing {i}"} for i in range(8)]
    with make_client(async_write_min_texts=3, max_tools_per_registry=9) as http:
        client = ShortlistClient("http://testserver", http_client=http)
        info = client.put_registry("r", tools)
        assert (info.version, info.tools) == (1, 8)
        with pytest.raises(PayloadTooLargeError):
            client.upsert_tools("r", [{"name": f"n{i}", "description": f"new {i}"} for i in range(4)])
        assert client.upsert_tools("r", [{"name": "one", "description": "one more"}]).version == 2


def test_record_codec_round_trips_like_the_standard_library():
    import json

    from registry.store import codec

    data = {"tools": [{"name": "é/ü", "n": 2**70, "x": 1.5e16, "e": [], "s": "\u2028"}], "v": 3}
    assert json.loads(codec.dumps(data)) == data  # a 70-bit integer falls back to json
    plain = {"tools": [{"name": "naïve", "description": "line\nbreak", "f": 0.1}]}
    assert codec.dumps(plain) == json.dumps(plain, ensure_ascii=False, separators=(",", ":")).encode()
    assert codec.loads(codec.dumps(plain)) == plain and codec.loads(b'{"a": NaN}')["a"] != 0
