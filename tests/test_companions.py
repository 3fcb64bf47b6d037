"""Companions learned from feedback (registry.learning.companions): the order counted from
calls and ``used``, the guards (one caller alone creates nothing, held-out requests can refuse
an edge, counts bounded, deleted tools forgotten, kept in the memory's state), and their use
in shortlists through the in-process core (fake embedder): a refit ships them, composition
appends them with their reason, ``called`` puts the learned next step first, an admin removal
wins, the learning switch and a wipe reset them, a restart keeps them. And the chain step of a
scoped request adds only allowed tools and keeps to the scoped count's cap, with stand-in and
with learned companions."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.core import Shortlister
from registry.feedback import FeedbackRequest, ToolCall
from registry.index.embed import HashingEmbedder
from registry.learning.companions import (
    CompanionConfig,
    CompanionCounts,
    candidate_edges,
    event_sequence,
    fit_companions,
)
from registry.learning.profiles import held_out
from registry.learning.usage import UsageConfig, UsageMemory
from registry.request import ShortlistRequest
from tests.cores import new_core
from tests.test_graph import REST
from tests.usage_events import Event, event

EMBED = HashingEmbedder()


def test_the_sequence_is_the_useful_calls_in_order_then_the_other_used_tools():
    e = Event("q", ("c", "a"), "s", calls=(ToolCall("a", True), ToolCall("x", False), ToolCall("b", True)))
    assert event_sequence(e) == ["a", "b", "c"]  # a useless call is no use; each tool once
    assert event_sequence(e, known={"a", "c"}) == ["a", "c"]
    assert event_sequence(Event("q", ("a", "b"), "s", success=False)) == []  # failed, no useful call


def test_one_caller_alone_creates_no_edge_and_two_do():
    memory = UsageMemory(EMBED.embed_query, UsageConfig())
    for i in range(6):
        memory.observe(event(f"find flights {i}", calls=("search", "book"), caller="alice"))
    counts = memory.companion_counts("r")
    assert counts.pairs[("search", "book")].uses > 3 and counts.uses["search"] > 3  # decayed repeats
    assert candidate_edges(counts, CompanionConfig()) == []  # one caller supports nothing
    for i in range(3):
        memory.observe(event(f"find a flight {i}", calls=("search", "book"), caller="bob"))
    [edge] = candidate_edges(memory.companion_counts("r"), CompanionConfig())
    assert (edge["first"], edge["then"], edge["callers"]) == ("search", "book", 2)
    assert edge["share"] == edge["back"] == 1.0
    assert 2.0 <= edge["uses"] < 9  # alice counts at most as much as bob


def test_a_rare_follower_is_no_companion():
    counts = CompanionCounts()
    for i in range(20):
        counts.add(["search", "book"] if i % 10 == 0 else ["search"], {}, f"c{i}")
        counts.add(["book"], {}, f"c{i}")  # a book is mostly booked alone, too
    assert candidate_edges(counts, CompanionConfig()) == []  # 2 of 20 searches, 2 of 22 books
    assert [e["then"] for e in candidate_edges(counts, CompanionConfig(min_share=0.05))] == ["book"]


def queries(template: str, n: int, held: bool) -> list[str]:
    """``n`` request texts in (``held``) or out of the held-out part every fit uses."""
    return [q for q in (template.format(i) for i in range(400)) if held_out(q) == held][:n]


def test_held_out_requests_refuse_an_edge_they_contradict_and_keep_one_they_confirm():
    memory = UsageMemory(EMBED.embed_query, UsageConfig())
    logged = []
    for i in range(8):  # the fit part: search -> book, login -> pay
        logged.append(event(queries("find a hotel {}", 8, False)[i], calls=("search", "book"), caller=f"c{i % 4}"))
        logged.append(event(queries("pay the bill {}", 8, False)[i], calls=("login", "pay"), caller=f"c{i % 4}"))
    for i in range(6):  # held out: search, then pay (not book); login, then pay
        logged.append(event(queries("find a hotel {}", 6, True)[i], calls=("search", "pay"), caller=f"c{i % 3}"))
        logged.append(event(queries("pay the bill {}", 6, True)[i], calls=("login", "pay"), caller=f"c{i % 3}"))
    for e in logged:
        assert memory.observe(e) == "counted"
    edges, fit = fit_companions(memory.companion_counts("r"), logged, CompanionConfig(min_share=0.3))
    assert [(e["first"], e["then"]) for e in edges] == [("login", "pay")]
    # login then pay in all 6 held-out logins; login before pay in 6 of the 12 held-out payments
    assert edges[0]["held_out_tries"] == 18 and edges[0]["held_out_share"] == 0.667
    assert fit["proposed"] == 2 and fit["refused_on_held_out"] == 1 and fit["held_out_events"] == 12
    # the held-out events propose nothing themselves: search -> pay is no candidate
    alone = [e for e in logged if held_out(e.query)]
    only_held = UsageMemory(EMBED.embed_query, UsageConfig())
    for e in alone:
        only_held.observe(e)
    assert fit_companions(only_held.companion_counts("r"), alone, CompanionConfig())[0] == []


def test_counts_are_kept_in_the_state_forgotten_with_a_tool_and_by_a_wipe():
    memory = UsageMemory(EMBED.embed_query, UsageConfig())
    for i in range(4):
        memory.observe(event(f"q{i}", calls=("search", "book", "pay"), caller=f"c{i}"))
    raw = memory.state_bytes("r")
    assert raw is not None
    restored = UsageMemory(EMBED.embed_query, UsageConfig())
    restored.load_state("r", raw)
    assert restored.companion_counts("r") == memory.companion_counts("r")
    assert restored.report("r")["companion_pairs"] == 3  # every ordered pair of the sequence
    assert restored.drop_tools("r", keep={"search", "book"}) == 1
    assert set(restored.companion_counts("r").pairs) == {("search", "book")}
    restored.wipe("r", at=2000.0)
    assert restored.companion_counts("r") == CompanionCounts()


LEARN = {"learning_save_interval_seconds": 0.0}
PAIR = ("get_flight_offers", "get_weather")  # no schema edge: what agents' traces show
CITIES = ["paris", "rome", "berlin", "madrid", "lisbon", "vienna", "prague", "oslo", "dublin", "athens",
          "porto", "milan", "munich", "zurich", "krakow", "riga"]  # fmt: skip


def core_for(settings, bor_policy) -> Shortlister:
    return new_core(settings.model_copy(update=LEARN), bor_policy=bor_policy)


def teach(core: Shortlister, n: int = 16) -> None:
    """Agents (three callers) that find flights, then check the weather at the destination."""
    for i in range(n):
        query = f"flights from {CITIES[i % len(CITIES)]} to {CITIES[(i + 3) % len(CITIES)]} next week"
        result = core.shortlist(ShortlistRequest("shop", query), caller=f"agent-{i % 3}")
        calls = [{"tool": "search_airport", "useful": True}, {"tool": PAIR[0], "useful": True},
                 {"tool": PAIR[1], "useful": True}]  # fmt: skip
        report = FeedbackRequest(result.shortlist_id, [PAIR[0], PAIR[1]], calls, True)
        core.feedback(report, caller=f"agent-{i % 3}")


QUERY = "cheap flights from london to boston"


def names(core: Shortlister, **kw) -> list[tuple[str, str | None]]:
    return [(t.name, t.reason) for t in core.shortlist(ShortlistRequest("shop", QUERY, **kw)).tools]


def test_a_refit_ships_companions_that_composition_and_called_use(settings, bor_policy):
    core = core_for(settings, bor_policy)
    try:
        core.put_registry("shop", REST)
        before = names(core)
        assert PAIR[0] in [n for n, _ in before] and PAIR[1] not in [n for n, _ in before]
        teach(core)
        assert names(core) == before  # counted, not shipped: nothing changes before a refit
        job = core.policies.refit("shop")
        fit = job.estimate["profile"]["companions"]
        assert fit["shipped"] >= 1, job.estimate
        learned = {(e["first"], e["then"]): e for e in core.graph("shop")["learned"]}
        edge = learned[PAIR]
        assert edge["callers"] == 3 and edge["active"] and edge["share"] == 1.0
        after = names(core)
        why = f"learned companion of {PAIR[0]} (3 callers, {round(edge['uses'])} uses)"
        assert after[: len(before)] == before and after[len(before)] == (PAIR[1], why)  # appended, last
        step = names(core, called=(PAIR[0],))
        assert step[0] == (PAIR[1], f"next step after {PAIR[0]} (called): {why}")
        assert core.learning_report("shop")["companions"] == len(learned)
    finally:
        core.close()
    # a restart keeps them (the control record); an admin removal wins over learning
    core = core_for(settings, bor_policy)
    try:
        assert names(core)[len(before)] == (PAIR[1], why)
        core.edit_graph("shop", remove=[list(PAIR)])
        assert (PAIR[1], why) not in names(core)  # (search_airport's companion, learned alike, may be)
        core.edit_graph("shop", remove=[["search_airport", PAIR[1]]])
        assert PAIR[1] not in [n for n, _ in names(core)]
        assert {(e["first"], e["then"]): e["active"] for e in core.graph("shop")["learned"]}[PAIR] is False
    finally:
        core.close()


def test_a_scoped_request_keeps_learned_companions_inside_its_scope_and_cap(settings, bor_policy):
    """Companions learned from real feedback (the usage memory and a refit, not a stand-in): a
    request scoped to 8 tools shows only allowed ones, the learned next step still first, and no
    more than half the scoped count (4) even where the whole registry would add more."""
    core = core_for(settings, bor_policy)
    try:
        core.put_registry("shop", REST)
        teach(core)
        core.policies.refit("shop")
        step = names(core, called=(PAIR[0],))
        assert [n for n, _ in step[:2]] == [PAIR[1], "search_airport"]  # search_airport: learned alike
        allowed = (PAIR[1], "search_airport", "find_customer_by_email", "search_films", "get_film",
                   "get_film_cast", "get_customer", "whoami")  # fmt: skip
        scoped = core.shortlist(ShortlistRequest("shop", QUERY, called=(PAIR[0],), allowed_tools=allowed))
        shown = [t.name for t in scoped.tools]
        assert scoped.n_tools == 8 and shown[0] == PAIR[1] and set(shown) <= set(allowed)
        assert len(shown) <= 4, shown
        without = core.shortlist(ShortlistRequest("shop", QUERY, called=(PAIR[0],), allowed_tools=allowed[2:]))
        assert PAIR[1] not in [t.name for t in without.tools]  # a learned step outside the scope is not shown
    finally:
        core.close()


def test_the_switch_and_a_wipe_reset_companions(settings, bor_policy):
    core = core_for(settings, bor_policy)
    try:
        core.put_registry("shop", REST)
        before = names(core)
        teach(core)
        core.policies.refit("shop")
        assert len(names(core)) == len(before) + 1
        core.set_learning("shop", False)
        assert names(core) == before
        assert not core.graph("shop")["learned"][0]["active"]
        core.set_learning("shop", True)
        assert len(names(core)) == len(before) + 1
        wiped = core.wipe_learning("shop")
        assert wiped["companions"] == 0 and wiped["companion_pairs"] == 0
        assert names(core) == before and core.graph("shop")["learned"] == []
        core.policies.refit("shop")  # the wiped counts ship nothing
        assert names(core) == before
    finally:
        core.close()


def test_a_scoped_request_adds_only_allowed_tools_in_its_chain_step(engine):
    engine.writer.put_registry("shop", REST)
    query = "return the items of order 17"
    whole = [t.name for t in engine.shortlist(ShortlistRequest("shop", query, max_k=5)).tools]
    assert whole == ["return_order_items", "list_orders", "whoami"]  # whoami fills list_orders' need
    allowed = ("return_order_items", "list_orders", "find_customer_by_email")
    scoped = engine.shortlist(ShortlistRequest("shop", query, max_k=5, allowed_tools=allowed))
    assert [(t.name, t.reason) for t in scoped.tools] == [
        ("return_order_items", None),
        ("list_orders", "prerequisite of return_order_items: fills 'order_id'"),
        ("find_customer_by_email", "prerequisite of list_orders: fills 'customer_id'"),
    ]


@pytest.fixture
def settings(tmp_path: Path):
    from registry.settings import Settings

    return Settings(data_dir=tmp_path / "data", demo_registry=None, explore_share=0.0)


def test_only_a_strong_learned_follower_takes_a_ranked_tools_place_after_called():
    from registry.index.graph import ToolGraph
    from registry.serving.chains import Companions, LearnedEdge, append_companions, next_steps_first
    from registry.serving.compose import Pick

    def edge(first: int, then: int, share: float, back: float = 0.1) -> LearnedEdge:
        return LearnedEdge(first, then, uses=6.0, callers=3, share=share, back=back)

    picks = [Pick(1, 0.9), Pick(2, 0.8), Pick(3, 0.7)]
    weak = Companions.of([edge(0, 5, 0.25), edge(0, 6, 0.2)])  # a token before many actions
    strong = Companions.of([edge(0, 5, 0.8), edge(0, 6, 0.2)])

    def scores(tools):
        return {t: 0.1 for t in tools}

    def name(tool: int) -> str:
        return f"t{tool}"

    kept = next_steps_first(picks, ToolGraph(), [0], scores, name, cap=5, companions=weak)
    assert [p.tool for p in kept] == [1, 2, 3]
    moved = next_steps_first(picks, ToolGraph(), [0], scores, name, cap=5, companions=strong)
    assert [p.tool for p in moved] == [5, 1, 2]  # the list keeps its length
    assert moved[0].reason == "next step after t0 (called): learned companion of t0 (3 callers, 6 uses)"
    # appended: two companions per list, the strongest first, of the first two shown tools
    # only, never a disallowed one
    shown = [Pick(0, 0.9), Pick(7, 0.8), Pick(8, 0.7)]
    both = Companions.of([edge(0, 5, 0.8), edge(0, 6, 0.7), edge(0, 4, 0.6), edge(7, 9, 0.9), edge(8, 11, 1.0)])
    assert [p.tool for p in append_companions(shown, both, scores, name, cap=10)] == [0, 7, 8, 9, 5]
    assert [p.tool for p in append_companions(shown, both, scores, name, cap=10, allowed=lambda t: t != 5)] == [
        0, 7, 8, 9, 6]
    assert [p.tool for p in append_companions(shown, both, scores, name, cap=4)] == [0, 7, 8, 9]  # the cap
    assert [p.tool for p in append_companions(shown, weak, scores, name, cap=10)] == [0, 7, 8]  # too weak


def test_a_scoped_request_caps_its_chain_step_at_the_scoped_count(settings, hashing_embedder, bor_policy):
    """The depth limit of a scoped request is the scoped count's (half of 8 allowed tools: 4),
    not the registry's (half of 12: 6), in the chain step as everywhere."""
    from registry.assembly import Registries
    from registry.serving.chains import Companions, LearnedEdge
    from registry.store.local import LocalStore

    class Learned:
        """A learning loop that shipped two strong companions of return_order_items."""

        def rerank(self, snap, query, ids, scores, **_):
            return ids, scores

        def companions(self, snap):
            at = snap.by_name
            return Companions.of(
                LearnedEdge(at["return_order_items"], at[t], 5.0, 3, 1.0, 1.0) for t in ("get_weather", "get_film")
            )

    engine = Registries.build(settings, LocalStore(settings.data_dir), hashing_embedder, bor_policy, usage=Learned())
    engine.writer.put_registry("shop", REST)
    query = "return the items of order 17"
    whole = [t.name for t in engine.shortlist(ShortlistRequest("shop", query, max_k=10)).tools]
    assert whole == ["return_order_items", "list_orders", "whoami", "get_film", "get_weather"]  # 5 > 4
    allowed = ("return_order_items", "list_orders", "whoami", "get_film", "get_weather", "search_films",
               "get_film_cast", "search_airport")  # fmt: skip
    scoped = engine.shortlist(ShortlistRequest("shop", query, max_k=10, allowed_tools=allowed))
    assert [t.name for t in scoped.tools] == whole[:4] and scoped.n_tools == len(allowed)


def test_pairs_and_their_callers_are_bounded(monkeypatch):
    from registry.learning import companions

    monkeypatch.setattr(companions, "MAX_PAIRS", 100)
    counts = CompanionCounts()
    counts.add(["a", "b"], {}, "c0")
    for i in range(20):
        counts.add(["a", "b"], {}, f"c{i}")  # the strongest pair, by 20 callers
    for i in range(300):
        counts.add([f"x{i}", f"y{i}"], {}, "c0")
    assert len(counts.pairs) <= 100 and ("a", "b") in counts.pairs
    assert len(counts.pairs[("a", "b")].callers) == companions.MAX_PAIR_CALLERS
    assert counts.pairs[("a", "b")].uses == 21


def test_a_learned_predecessor_is_the_provider_chosen_for_a_need():
    from registry.index.graph import ToolGraph
    from registry.serving.chains import Companions, LearnedEdge, append_prerequisites
    from registry.serving.compose import Pick

    graph = ToolGraph(edges=(), needs={0: (("order_id", (1, 2)),)}, successors={1: (0,), 2: (0,)})

    def scores(tools):
        return {t: {1: 0.9, 2: 0.1}.get(t, 0.0) for t in tools}

    def name(tool: int) -> str:
        return f"t{tool}"

    assert [p.tool for p in append_prerequisites([Pick(0, 1.0)], graph, scores, name, cap=5)] == [0, 1]
    learned = Companions.of([LearnedEdge(2, 0, 4.0, 2, 0.6, 0.6)])  # agents call t2 before t0
    chosen = append_prerequisites([Pick(0, 1.0)], graph, scores, name, cap=5, companions=learned)
    assert [p.tool for p in chosen] == [0, 2]
