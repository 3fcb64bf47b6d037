"""The engine with a fast fake embedder: writes, versions, cache reuse, shortlist rules."""

from __future__ import annotations

import pytest

from registry.errors import (
    InvalidRegistryName,
    InvalidToolDefinition,
    PayloadTooLarge,
    RegistryNotFound,
    ToolNotFound,
    ValidationFailed,
)
from registry.request import ShortlistRequest
from tests.cores import new_engine


def test_put_creates_and_versions_increase(engine, tools_payload):
    first = engine.writer.put_registry("r", tools_payload)
    second = engine.writer.put_registry("r", {"tools": tools_payload[:2]})
    assert (first.version, first.tools) == (1, 4)
    assert (second.version, second.tools) == (2, 2)
    assert [i.registry for i in engine.snapshots.list_registries()] == ["r"]


def test_invalid_upload_changes_nothing(engine, tools_payload):
    engine.writer.put_registry("r", tools_payload)
    bad = [*tools_payload, {"name": ""}, {"description": 3}]
    with pytest.raises(InvalidToolDefinition) as err:
        engine.writer.put_registry("r", bad)
    assert {d["index"] for d in err.value.details} == {4, 5}
    snap = engine.snapshots.snapshot("r")
    assert snap.version == 1 and snap.n_tools == 4
    assert engine.writer.store.load("r").version == 1


def test_bad_registry_name(engine, tools_payload):
    with pytest.raises(InvalidRegistryName):
        engine.writer.put_registry("../etc", tools_payload)


def test_create_registry_only_when_absent(engine, tools_payload):
    info = engine.writer.create_registry("r", tools_payload)
    assert info is not None and info.version == 1
    assert engine.writer.create_registry("r", tools_payload[:1]) is None
    assert engine.snapshots.snapshot("r").version == 1 and engine.snapshots.snapshot("r").n_tools == len(tools_payload)
    with pytest.raises(ValidationFailed):
        engine.writer.create_registry("s", [{"name": ""}])
    assert not engine.snapshots.has_registry("s")


def test_upsert_merges_by_name_and_keeps_definitions(engine, tools_payload):
    engine.writer.put_registry("r", tools_payload[:2])
    changed = {"name": "get_weather", "description": "Weather now and later.", "x-extra": [1]}
    info = engine.writer.upsert_tools("r", [changed, tools_payload[3]])
    assert (info.version, info.tools) == (2, 3)
    definitions = engine.snapshots.snapshot("r").definitions()
    assert changed in definitions and tools_payload[1] in definitions


def test_upsert_creates_missing_registry_and_respects_the_tool_limit(settings, hashing_embedder, bor_policy, tools_payload):
    small = settings.model_copy(update={"max_tools_per_registry": 4})
    engine = new_engine(small, embedder=hashing_embedder, bor_policy=bor_policy)
    assert engine.writer.upsert_tools("new", tools_payload[:3]).version == 1
    with pytest.raises(PayloadTooLarge):
        engine.writer.upsert_tools("new", [{"name": "x"}, {"name": "y"}])
    assert engine.snapshots.snapshot("new").n_tools == 3


def test_deletes(engine, tools_payload):
    engine.writer.put_registry("r", tools_payload)
    engine.writer.delete_tool("r", "fs/read_file")
    assert "fs/read_file" not in engine.snapshots.snapshot("r").by_name
    with pytest.raises(ToolNotFound):
        engine.writer.delete_tool("r", "fs/read_file")
    engine.writer.delete_registry("r")
    with pytest.raises(RegistryNotFound):
        engine.snapshots.snapshot("r")
    with pytest.raises(RegistryNotFound):
        engine.writer.delete_registry("r")


def test_reupload_reuses_cached_embeddings_across_restarts(settings, hashing_embedder, bor_policy, tools_payload):
    engine = new_engine(settings, embedder=hashing_embedder, bor_policy=bor_policy)
    engine.writer.put_registry("r", tools_payload)
    assert hashing_embedder.documents == 4
    engine.writer.put_registry("r", tools_payload)
    assert hashing_embedder.documents == 4
    restarted = new_engine(settings, embedder=hashing_embedder, bor_policy=bor_policy)
    assert restarted.writer.load_all() == 1
    assert hashing_embedder.documents == 4
    assert restarted.snapshots.snapshot("r").version == 2
    restarted.writer.upsert_tools("r", [{"name": "new_tool", "description": "Brand new."}])
    assert hashing_embedder.documents == 5


def test_shortlist_shape_and_rules(engine, tools_payload):
    engine.writer.put_registry("r", tools_payload)
    result = engine.shortlist(ShortlistRequest("r", "what is the weather in Paris"))
    assert result.k == len(result.tools) >= 1
    assert result.tools[0].name == "get_weather"
    assert [t.rank for t in result.tools] == list(range(1, result.k + 1))
    assert result.p_rand == pytest.approx(result.k / 4)
    assert set(result.timings) == {"embed", "search", "policy", "total"}

    fixed = engine.shortlist(ShortlistRequest("r", "weather", k=3))
    assert (fixed.policy, fixed.k) == ("fixed", 3)
    everything = engine.shortlist(ShortlistRequest("r", "weather", k=1000))
    assert everything.k == 4  # k above the registry size returns the whole registry
    scores = [t.score for t in everything.tools]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("scorer", ["dense", "bm25", "hybrid"])
@pytest.mark.parametrize("policy", ["bor", "fixed", "gap", "threshold"])
def test_every_policy_and_scorer_stays_within_bounds(engine, tools_payload, scorer, policy):
    engine.writer.put_registry("r", tools_payload)
    result = engine.shortlist(ShortlistRequest("r", "read a file", policy=policy, scorer=scorer, max_k=2))
    assert 1 <= result.k <= 2
    assert (result.policy, result.scorer) == (policy, scorer)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"query": "  "}, "query"),
        ({"query": "x" * 300_000}, "query"),
        ({"query": "q", "k": 0}, "k"),
        ({"query": "q", "k": 1001}, "k"),
        ({"query": "q", "max_k": 0}, "max_k"),
        ({"query": "q", "policy": "magic"}, "policy"),
        ({"query": "q", "scorer": "magic"}, "scorer"),
        ({"query": "q", "depth_bias": 10.5}, "depth_bias"),
        ({"query": "q", "depth_bias": float("nan")}, "depth_bias"),
        ({"query": "q", "depth_bias": True}, "depth_bias"),
        ({"query": "q", "depth_bias": 0.5, "k": 3}, "depth_bias"),
        ({"query": "q", "depth_bias": 0.5, "policy": "gap"}, "depth_bias"),
    ],
)
def test_bad_shortlist_requests_name_the_field(engine, tools_payload, kwargs, field):
    engine.writer.put_registry("r", tools_payload)
    query = kwargs.pop("query")
    with pytest.raises(ValidationFailed) as err:
        engine.shortlist(ShortlistRequest("r", query, **kwargs))
    assert [d["field"] for d in err.value.details] == [field]


def test_depth_bias_moves_the_bor_cut_and_defaults_to_the_setting(settings, hashing_embedder, bor_policy):
    tools = [{"name": f"tool_{i}", "description": f"does thing {i} with item {i % 7}"} for i in range(60)]
    engine = new_engine(settings, embedder=hashing_embedder, bor_policy=bor_policy)
    engine.writer.put_registry("r", tools)
    queries = [f"do thing {i} with item {i % 5}" for i in range(25)]
    lengths = {b: [engine.shortlist(ShortlistRequest("r", q, depth_bias=b)).k for q in queries] for b in (-10, -0.5, 0, 0.5, 10)}
    for i in range(len(queries)):
        ks = [lengths[b][i] for b in (-10, -0.5, 0, 0.5, 10)]
        assert ks == sorted(ks)
    assert set(lengths[-10]) == {1} and set(lengths[10]) == {20}  # one tool / the default cap
    result = engine.shortlist(ShortlistRequest("r", queries[0], depth_bias=0.5))
    assert result.depth_bias == 0.5 and result.policy == "bor"
    assert engine.shortlist(ShortlistRequest("r", queries[0])).depth_bias == 0.0
    assert engine.shortlist(ShortlistRequest("r", queries[0], policy="gap")).depth_bias is None
    assert engine.shortlist(ShortlistRequest("r", queries[0], k=2)).depth_bias is None

    longer_settings = settings.model_copy(update={"depth_bias": 10.0})
    longer = new_engine(longer_settings, store=engine.writer.store, embedder=hashing_embedder, bor_policy=bor_policy)
    longer.writer.load_all()
    assert longer.shortlist(ShortlistRequest("r", queries[0])).k == 20
    assert longer.shortlist(ShortlistRequest("r", queries[0], depth_bias=-10)).k == 1  # the request wins


def test_empty_registry_gives_an_empty_shortlist(engine):
    engine.writer.put_registry("empty", [])
    result = engine.shortlist(ShortlistRequest("empty", "anything"))
    assert result.k == 0 and result.tools == [] and result.n_tools == 0


def test_unknown_registry(engine):
    with pytest.raises(RegistryNotFound):
        engine.shortlist(ShortlistRequest("nope", "q"))


def test_writes_to_a_large_registry_derive_the_hnsw_graph(settings, hashing_embedder, bor_policy):
    """Above hnsw_min_tools an upsert or delete reuses the previous graph; search stays right:
    the new tool is found, the deleted one never comes back, changed text is searched anew."""
    small = settings.model_copy(update={"hnsw_min_tools": 50})
    engine = new_engine(small, embedder=hashing_embedder, bor_policy=bor_policy)
    tools = [{"name": f"tool_{i}", "description": f"handles topic{i} and subject{i % 9}"} for i in range(120)]
    engine.writer.put_registry("big", tools)
    assert engine.snapshots.snapshot("big").dense.kind == "hnsw"
    first_graph = engine.snapshots.snapshot("big").dense._index
    engine.writer.upsert_tools("big", [{"name": "zebra_tool", "description": "counts zebras on the savanna"}])
    engine.writer.delete_tool("big", "tool_7")
    engine.writer.upsert_tools("big", [{"name": "tool_3", "description": "now about volcanoes and lava"}])
    snap = engine.snapshots.snapshot("big")
    assert snap.dense._index is not first_graph and snap.dense.dead_slots == 2  # tool_7, old tool_3
    found = engine.shortlist(ShortlistRequest("big", "counts zebras on the savanna", scorer="dense", k=1))
    assert found.tools[0].name == "zebra_tool"
    assert engine.shortlist(ShortlistRequest("big", "volcanoes and lava", scorer="dense", k=1)).tools[0].name == "tool_3"
    for query in ("handles topic7 and subject7", "topic7"):
        names = [t.name for t in engine.shortlist(ShortlistRequest("big", query, scorer="dense", k=50)).tools]
        assert "tool_7" not in names and len(names) == 50
    restarted = new_engine(small, embedder=hashing_embedder, bor_policy=bor_policy)
    restarted.writer.load_all()  # a fresh build gives the same answers
    assert restarted.snapshots.snapshot("big").dense.dead_slots == 0
    assert restarted.shortlist(ShortlistRequest("big", "counts zebras on the savanna", scorer="dense", k=1)).tools[0].name == "zebra_tool"
