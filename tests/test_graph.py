"""The prerequisite graph: golden graphs read from a small REST-style registry and from a real
MCP server's ``tools/list``; admin edits as versioned writes (unknown names refused, nothing
changed); the graph kept across a restart; and its use in a shortlist (prerequisites appended
with their reason, the next steps after ``called`` first, a fixed ``k`` untouched)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.errors import RegistryNotFound, ValidationFailed
from registry.index.graph import ToolGraph, tool_facts
from registry.index.graph_edits import EdgeEdits
from registry.request import ShortlistRequest
from registry.tools import parse_tools
from tests.cores import new_engine

FIXTURES = Path(__file__).parent / "fixtures"


def fn(name: str, description: str, required: dict[str, str], **optional: str) -> dict:
    """An OpenAI-style tool whose ``required`` parameters map to their descriptions."""
    props = {p: {"type": "string", "description": d} for p, d in {**required, **optional}.items()}
    return {"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(required)}}}  # fmt: skip


REST = [
    fn("search_films", "Search the catalogue of films by title words.", {"query": "Title words."}),
    fn("get_film", "Details of one film.", {"film_id": "The film."}),
    fn("get_film_cast", "The cast of a film.", {"film_id": "The film."}),
    fn("find_customer_by_email", "Find a customer from an email address.", {"email": "Address."}),
    fn("get_customer", "A customer's record.", {"customer_id": "The customer."}),
    fn("list_orders", "A customer's orders.", {"customer_id": "The customer."}),
    fn("get_order", "One order with its items.", {"orderId": "The order."}),
    fn("return_order_items", "Return items of an order.", {"order_id": "The order.", "items": "Item ids."}),
    fn("get_flight_offers", "Flights between two airports.",
       {"originSkyId": "The origin airport code; can be extracted from the Search Airport API."}),
    fn("search_airport", "Search airports by city name.", {"query": "City."}),
    fn("get_weather", "Weather forecast for a city.", {"city": "City name."}),
    {"name": "whoami", "description": "The signed-in account.",
     "inputSchema": {"type": "object", "properties": {}},
     "outputSchema": {"type": "object", "properties": {"customer_id": {"type": "string"}}}},
]  # fmt: skip

REST_GOLDEN = [  # (provider, consumer, param, source), consumers in registry order
    ("search_films", "get_film", "film_id", "schema"),
    ("search_films", "get_film_cast", "film_id", "schema"),
    ("find_customer_by_email", "get_customer", "customer_id", "schema"),
    ("whoami", "get_customer", "customer_id", "output"),
    ("find_customer_by_email", "list_orders", "customer_id", "schema"),
    ("whoami", "list_orders", "customer_id", "output"),
    ("list_orders", "get_order", "orderId", "schema"),
    ("list_orders", "return_order_items", "order_id", "schema"),
    ("search_airport", "get_flight_offers", "originSkyId", "parameter"),
]

SLACK_GOLDEN = [  # the Slack MCP server's tools/list (tests/fixtures/mcp_small.json)
    ("slack_list_channels", "slack_post_message", "channel_id", "schema"),
    ("slack_list_channels", "slack_reply_to_thread", "channel_id", "schema"),
    ("slack_list_channels", "slack_add_reaction", "channel_id", "schema"),
    ("slack_list_channels", "slack_get_channel_history", "channel_id", "schema"),
    ("slack_list_channels", "slack_get_thread_replies", "channel_id", "schema"),
    ("slack_get_users", "slack_get_user_profile", "user_id", "schema"),
]


def edges(graph: ToolGraph) -> list[tuple[str, str, str, str]]:
    return [(e.provider, e.consumer, e.param, e.source) for e in graph.edges]


def test_golden_graph_of_a_rest_style_registry():
    graph = ToolGraph.build(parse_tools(REST))
    assert edges(graph) == REST_GOLDEN
    why = {(e.provider, e.consumer): e.evidence for e in graph.edges}
    assert why[("search_films", "get_film")] == "'film_id' names film; its name searchs film"
    assert why[("whoami", "get_customer")] == "'customer_id' names customer; its outputSchema returns 'customer_id'"
    assert why[("search_airport", "get_flight_offers")] == "'originSkyId''s description names search_airport"


def test_golden_graph_of_a_real_mcp_servers_tools_list():
    tools = parse_tools(json.loads((FIXTURES / "mcp_small.json").read_text()))
    assert edges(ToolGraph.build(tools)) == SLACK_GOLDEN
    filesystem = json.loads((FIXTURES / "mcp_filesystem.json").read_text())
    assert ToolGraph.build(parse_tools(filesystem)).edges == ()  # paths are not ids: no chains


def test_a_tool_that_needs_an_id_never_provides_it_and_facts_are_reused():
    tools = parse_tools(REST)
    facts = {t.name: tool_facts(t) for t in tools}
    assert ("film_id", "film") in facts["get_film"].needs
    assert "film" not in {entity for entity, _, _ in facts["get_film"].provides}
    graph = ToolGraph.build(tools)
    changed = parse_tools([*REST[:-1], fn("whoami", "Changed.", {})])
    again = ToolGraph.build(changed, previous=graph)
    assert all(again.facts[t.content_hash()] is graph.facts[t.content_hash()] for t in changed[:-1])
    assert ("whoami", "get_customer", "customer_id", "output") not in edges(again)


def test_edits_add_and_remove_edges_by_name_and_drop_with_a_deleted_tool():
    tools = parse_tools(REST)
    edits = EdgeEdits().changed([("get_customer", "get_order")], [("search_films", "get_film")])
    graph = ToolGraph.build(tools, edits=edits)
    assert ("get_customer", "get_order", "", "admin") in edges(graph)
    assert ("search_films", "get_film", "film_id", "schema") not in edges(graph)
    assert graph.to_json()["edits"] == {"added": [["get_customer", "get_order"]],
                                        "removed": [["search_films", "get_film"]]}  # fmt: skip
    assert edits.kept(["get_customer", "search_films", "get_film"]).added == ()
    assert EdgeEdits.from_json(edits.to_json()) == edits


# -- in the engine (hashing embedder: fast, same code path) ------------------------------------


def test_edit_graph_is_a_versioned_write_and_unknown_names_change_nothing(engine, settings, hashing_embedder, bor_policy):
    engine.writer.put_registry("shop", REST)
    info = engine.writer.edit_graph("shop", add=[["get_customer", "get_order"]], remove=[["search_films", "get_film"]])
    assert info.version == 2
    graph = engine.snapshots.snapshot("shop").graph
    assert ("get_customer", "get_order", "", "admin") in edges(graph)
    with pytest.raises(ValidationFailed) as refused:
        engine.writer.edit_graph("shop", add=[["get_customer", "no_such_tool"], ["nope", "get_order"]])
    assert "no_such_tool" in refused.value.message and "nope" in refused.value.message
    with pytest.raises(ValidationFailed):
        engine.writer.edit_graph("shop", add=[["get_order", "get_order"]])
    with pytest.raises(ValidationFailed):
        engine.writer.edit_graph("shop", add=[["only_one"]])
    with pytest.raises(RegistryNotFound):
        engine.writer.edit_graph("nowhere", add=[["a", "b"]])
    assert engine.snapshots.snapshot("shop").version == 2
    engine.writer.upsert_tools("shop", [fn("cancel_order", "Cancel an order.", {"order_id": "The order."})])
    assert ("get_customer", "get_order", "", "admin") in edges(engine.snapshots.snapshot("shop").graph)  # kept
    engine.writer.delete_tool("shop", "get_customer")
    assert engine.snapshots.snapshot("shop").edits.added == ()  # the deleted tool took its edit


    engine.writer.edit_graph("shop", remove=[["list_orders", "get_order"]])
    restarted = new_engine(settings, embedder=hashing_embedder, bor_policy=bor_policy)
    restarted.writer.load_all()
    assert edges(restarted.snapshots.snapshot("shop").graph) == edges(engine.snapshots.snapshot("shop").graph)
    assert restarted.snapshots.snapshot("shop").edits.removed == (("search_films", "get_film"), ("list_orders", "get_order"))


def test_shortlist_appends_missing_prerequisites_two_levels_deep_with_their_reason(engine):
    engine.writer.put_registry("shop", REST)
    answer = engine.shortlist(ShortlistRequest("shop", "return the items of order 17", max_k=5))
    assert [(t.name, t.reason) for t in answer.tools] == [
        ("return_order_items", None),
        ("list_orders", "prerequisite of return_order_items: fills 'order_id'"),
        ("whoami", "prerequisite of list_orders: fills 'customer_id'"),
    ]
    assert answer.k == 3 and answer.to_json()["tools"][1]["reason"].startswith("prerequisite of")
    named = engine.shortlist(ShortlistRequest("shop", "show the cast of film 42: get_film_cast", max_k=5))
    assert [t.name for t in named.tools] == ["get_film_cast", "search_films"]
    fixed = engine.shortlist(ShortlistRequest("shop", "return the items of order 17", k=1))
    assert [t.name for t in fixed.tools] == ["return_order_items"]  # a fixed k is exactly k tools
    capped = engine.shortlist(ShortlistRequest("shop", "return the items of order 17", max_k=2))
    assert [t.name for t in capped.tools] == ["return_order_items", "list_orders"]  # never past the cap


def test_called_drops_the_called_tools_and_puts_their_next_steps_first(engine):
    engine.writer.put_registry("shop", REST)
    query = "my email is ann@example.com: return the items of my last order"
    answer = engine.shortlist(ShortlistRequest("shop", query, called=("find_customer_by_email",)))
    names = [t.name for t in answer.tools]
    assert "find_customer_by_email" not in names
    assert names[0] in ("get_customer", "list_orders")
    assert answer.tools[0].reason == "next step after find_customer_by_email (called)"
    later = engine.shortlist(ShortlistRequest("shop", query, called=("find_customer_by_email", "list_orders")))
    assert later.tools[0].name in ("get_order", "return_order_items")
    with pytest.raises(ValidationFailed) as refused:
        engine.shortlist(ShortlistRequest("shop", query, called=("list_orders", "no_such_tool")))
    assert refused.value.details == [{"field": "called", "message": "unknown tool 'no_such_tool'"}]
    with pytest.raises(ValidationFailed):
        engine.shortlist(ShortlistRequest("shop", query, called="list_orders"))


def test_called_with_a_fixed_k_keeps_k_tools(engine):
    engine.writer.put_registry("shop", REST)
    query = "my email is ann@example.com: return the items of my last order"
    first = engine.shortlist(ShortlistRequest("shop", query, k=2))
    after = engine.shortlist(ShortlistRequest("shop", query, k=2, called=(first.tools[0].name,)))
    assert after.k == 2 and first.tools[0].name not in [t.name for t in after.tools]
    one = engine.shortlist(ShortlistRequest("shop", query, k=1, called=("find_customer_by_email",)))
    assert [t.name for t in one.tools] in (["get_customer"], ["list_orders"])


def test_a_graph_derived_from_the_previous_version_equals_one_built_afresh():
    """Appending tools re-joins only what they can change; replacing or deleting rebuilds."""
    tools = parse_tools(REST)
    more = parse_tools([*REST, fn("cancel_order", "Cancel an order.", {"order_id": "The order."}),
                        fn("list_films", "All films.", {"genre": "A genre."})])  # fmt: skip
    for before, after in ((tools[:3], tools), (tools, more), (more, tools), (more[1:], more)):
        derived = ToolGraph.build(after, previous=ToolGraph.build(before))
        fresh = ToolGraph.build(after)
        assert derived.edges == fresh.edges and derived.needs == fresh.needs
        assert derived.successors == fresh.successors
    assert ("list_films", "get_film", "film_id", "schema") in edges(ToolGraph.build(more, previous=ToolGraph.build(tools)))
