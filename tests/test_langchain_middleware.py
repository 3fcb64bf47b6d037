"""LangChain v1 ``ShortlistMiddleware`` in real ``langchain.agents.create_agent`` graphs, with a
fake chat model (langchain_core's GenericFakeChatModel playing scripted tool calls) over a real
server with MiniLM: the tools each model call is bound with, the pins, the depth knobs, the
feedback the service records, provider-safe names, the async path, and docs/client.md's snippet run
as written."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import weather_tools
from tests.doc_examples import client_doc_block
from tool_shortlist_client import AsyncShortlistClient, ShortlistClient

pytestmark = pytest.mark.e2e

WEATHER_QUERY = "what's the weather in Paris tomorrow?"
FILE_QUERY = "read the file notes.md from disk"
PAYMENTS = [
    {"type": "function", "function": {"name": "refund_payment", "description": "Refund a payment.",
     "parameters": {"type": "object", "properties": {"payment_id": {"type": "string"}}}}},
    {"name": "create_invoice", "description": "Create and send an invoice.",
     "input_schema": {"type": "object", "properties": {"customer": {"type": "string"}}}},
    {"name": "stripe/list_charges", "description": "List recent card charges.",
     "inputSchema": {"type": "object", "properties": {"limit": {"type": "integer"}}}},
    {"name": "get_balance", "description": "Current account balance.", "parameters": {}},
]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path):
    from tests.server import Servers

    servers = Servers(tmp_path_factory.mktemp("langchain"), minilm_cache)
    started = servers.start()
    with ShortlistClient(started.url) as admin:
        admin.put_registry("weather", weather_tools())
        admin.put_registry("payments", PAYMENTS)
    yield started
    servers.close()


@pytest.fixture
def client(server):
    with ShortlistClient(server.url, registry="weather") as c:
        yield c


def make_tools(names: list[str], calls: list[str], failing: tuple[str, ...] = ()) -> list[Any]:
    """LangChain tools that record their calls; a failing one raises a ToolException."""
    from langchain_core.tools import StructuredTool, ToolException

    def make(name: str) -> StructuredTool:
        def run(**kwargs: Any) -> str:
            calls.append(name)
            if name in failing:
                raise ToolException(f"{name} failed")
            return f"{name} ran with {json.dumps(kwargs, sort_keys=True)}"

        schema = {"type": "object", "properties": {"city": {"type": "string"}}}
        return StructuredTool.from_function(
            run, name=name, description=f"The {name} tool.", args_schema=schema,
            handle_tool_error=True,
        )  # fmt: skip

    return [make(name) for name in names]


def fake_model(bound: list[list[str]], *turns: list[str], answer: str = "Done."):
    """A chat model that, per entry of ``turns``, calls those tools (one AI message each), then
    answers; ``bound`` receives the tool names of every model call."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    class ToolBindingFake(GenericFakeChatModel):
        def bind_tools(self, tools, **_: Any):
            bound.append([getattr(t, "name", None) or t["name"] for t in tools])
            return self

    script: list[AIMessage] = []
    for t, names in enumerate(turns):
        calls = [
            {"name": n, "args": {"city": "Paris"}, "id": f"c{t}-{i}"} for i, n in enumerate(names)
        ]
        script += [AIMessage("", tool_calls=calls), AIMessage(answer)]
    return ToolBindingFake(messages=iter(script))


def tool_row(report: Any, name: str) -> Any:
    return next(tool for tool in report.tools if tool.name == name)


def test_each_model_call_sees_the_shortlist_and_the_called_tools_are_reported(server, client):
    from langchain.agents import create_agent

    from tool_shortlist_client.adapters.langchain import ShortlistMiddleware

    calls: list[str] = []
    tools = make_tools(["get_weather", "send_email", "convert_currency", "ask_human"], calls)
    bound: list[list[str]] = []
    middleware = ShortlistMiddleware(client, registry="weather", always_include=["ask_human"])
    agent = create_agent(fake_model(bound, ["get_weather"]), tools=tools, middleware=[middleware])
    before = tool_row(client.report("weather"), "get_weather")

    state = agent.invoke({"messages": [("user", WEATHER_QUERY)]})

    shortlist = middleware.last
    assert shortlist is not None and shortlist.names[0] == "get_weather"
    assert len(middleware.shortlists) == 1  # one shortlist per user turn, not per model call
    # The registry's 4th tool (fs/read_file) is not an agent tool: never shortlisted (the request
    # names the agent's tools as allowed_tools); the pin is last.
    assert "fs/read_file" not in shortlist.names
    assert bound[0] == [*shortlist.names, "ask_human"]
    # After the call, one re-ask with called=[get_weather]: the bound tools stay, what is new is
    # added before the pin.
    (reasked,) = middleware.reasked
    added = [n for n in reasked.names if n not in shortlist.names and n in {t.name for t in tools}]
    assert bound[1] == [*shortlist.names, *added, "ask_human"]
    assert calls == ["get_weather"]
    assert state["messages"][-1].content == "Done."
    # Feedback: the called shortlisted tool, as recorded by the service.
    (ack,) = middleware.feedback_results
    assert ack.shortlist_id == shortlist.shortlist_id and ack.presented.exact
    after = tool_row(client.report("weather"), "get_weather")
    assert (after.used, after.useful_calls) == (before.used + 1, before.useful_calls + 1)


def test_depth_knobs_reach_the_service(server, client):
    from langchain.agents import create_agent

    from tool_shortlist_client.adapters.langchain import ShortlistMiddleware

    names = ["get_weather", "send_email", "convert_currency"]
    for options, check in [
        ({"k": 1}, lambda s: s.k == 1),
        ({"policy": "fixed", "k": 2}, lambda s: s.k == 2 and s.policy == "fixed"),
        ({"max_k": 1}, lambda s: s.k == 1 and s.policy == "bor"),
        ({"depth_bias": 0.5}, lambda s: s.depth_bias == 0.5),
    ]:
        bound: list[list[str]] = []
        middleware = ShortlistMiddleware(client, feedback=False, **options)
        agent = create_agent(fake_model(bound, []), tools=make_tools(names, []),
                             middleware=[middleware])  # fmt: skip
        agent.invoke({"messages": [("user", WEATHER_QUERY)]})
        shortlist = middleware.last
        assert shortlist is not None and check(shortlist), (options, shortlist)
        assert bound[0] == [n for n in shortlist.names if n in names], options
        assert not middleware.feedback_results


def test_each_user_turn_gets_its_own_shortlist_and_feedback(server, client):
    """Two turns on one thread (a checkpointer keeps the history): the second model call of the
    conversation is shortlisted for the second question, not the first."""
    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver

    from tool_shortlist_client.adapters.langchain import ShortlistMiddleware

    calls: list[str] = []
    tools = make_tools(["get_weather", "send_email", "convert_currency"], calls)
    bound: list[list[str]] = []
    middleware = ShortlistMiddleware(client, k=1, reasks=0)  # re-asks: tests/test_chains_e2e.py
    model = fake_model(bound, ["get_weather"], ["convert_currency"])
    agent = create_agent(model, tools=tools, middleware=[middleware], checkpointer=InMemorySaver())
    thread = {"configurable": {"thread_id": "t1"}}
    agent.invoke({"messages": [("user", WEATHER_QUERY)]}, thread)
    agent.invoke({"messages": [("user", "convert 100 euros into dollars")]}, thread)

    assert [s.names for s in middleware.shortlists] == [["get_weather"], ["convert_currency"]]
    assert bound == [["get_weather"]] * 2 + [["convert_currency"]] * 2
    assert calls == ["get_weather", "convert_currency"]
    assert [a.shortlist_id for a in middleware.feedback_results] == [
        s.shortlist_id for s in middleware.shortlists
    ]


def test_provider_safe_agent_names_and_failed_calls(server, client):
    """An agent tool may carry the registry name's provider-safe form (fs/read_file ->
    fs__read_file); feedback goes back under the registry name, a failed call as not useful."""
    from langchain.agents import create_agent

    from tool_shortlist_client.adapters.langchain import ShortlistMiddleware
    from tool_shortlist_client.names import PROVIDER_NAME_PATTERN

    calls: list[str] = []
    tools = make_tools(["fs__read_file", "get_weather"], calls, failing=("fs__read_file",))
    bound: list[list[str]] = []
    middleware = ShortlistMiddleware(client, k=1)
    before = tool_row(client.report("weather"), "fs/read_file")
    agent = create_agent(fake_model(bound, ["fs__read_file"]), tools=tools,
                         middleware=[middleware])  # fmt: skip
    state = agent.invoke({"messages": [("user", FILE_QUERY)]})

    assert middleware.last is not None and middleware.last.names == ["fs/read_file"]
    assert bound[0] == ["fs__read_file"] and PROVIDER_NAME_PATTERN.match(bound[0][0])
    assert calls == ["fs__read_file"]
    assert any(getattr(m, "status", None) == "error" for m in state["messages"])
    assert middleware.feedback_results[0].presented.exact
    after = tool_row(client.report("weather"), "fs/read_file")
    assert (after.used, after.useless_calls) == (before.used + 1, before.useless_calls + 1)


def test_async_agent_with_the_async_client(server):
    from langchain.agents import create_agent

    from tool_shortlist_client.adapters.langchain import ShortlistMiddleware

    async def run() -> tuple[Any, list[list[str]], list[str]]:
        calls: list[str] = []
        bound: list[list[str]] = []
        async with AsyncShortlistClient(server.url, registry="weather") as aclient:
            middleware = ShortlistMiddleware(async_client=aclient, max_k=2)
            agent = create_agent(
                fake_model(bound, ["get_weather"]),
                tools=make_tools(["get_weather", "send_email", "convert_currency"], calls),
                middleware=[middleware],
            )
            await agent.ainvoke({"messages": [{"role": "user", "content": WEATHER_QUERY}]})
        return middleware, bound, calls

    middleware, bound, calls = asyncio.run(run())
    assert middleware.last.names[0] == "get_weather" and middleware.last.k <= 2
    agent_tools = ["get_weather", "send_email", "convert_currency"]
    assert bound[0] == [n for n in middleware.last.names if n in agent_tools]
    assert bound[0][0] == "get_weather" and len(bound[0]) <= 2
    (reasked,) = middleware.reasked  # the async path re-asks after the call too
    assert bound[1] == [*bound[0], *(n for n in reasked.names if n in agent_tools and n not in bound[0])]
    assert calls == ["get_weather"]
    assert middleware.feedback_results[0].presented.exact


def test_misconfiguration_fails_with_a_clear_error(server, client):
    from langchain.agents import create_agent

    from tool_shortlist_client.adapters.langchain import ShortlistMiddleware

    with pytest.raises(ValueError, match="give a client"):
        ShortlistMiddleware()
    unrelated = make_tools(["something_else"], [])
    agent = create_agent(fake_model([], []), tools=unrelated,
                         middleware=[ShortlistMiddleware(client)])  # fmt: skip
    with pytest.raises(ValueError, match="none of the shortlisted tools"):
        agent.invoke({"messages": [("user", WEATHER_QUERY)]})
    pinned = ShortlistMiddleware(client, always_include=["ask_human"])
    agent = create_agent(fake_model([], []), tools=make_tools(["get_weather"], []),
                         middleware=[pinned])  # fmt: skip
    with pytest.raises(ValueError, match=r"always_include .*\['ask_human'\]"):
        agent.invoke({"messages": [("user", WEATHER_QUERY)]})


def test_a_turn_without_text_keeps_every_tool(server, client):
    """An image-only user turn gives nothing to search with: the model sees all the tools, and
    nothing is asked of or reported to the service."""
    from langchain.agents import create_agent

    from tool_shortlist_client.adapters.langchain import ShortlistMiddleware

    names = ["get_weather", "send_email", "convert_currency"]
    bound: list[list[str]] = []
    middleware = ShortlistMiddleware(client)
    agent = create_agent(
        fake_model(bound, ["get_weather"]), tools=make_tools(names, []), middleware=[middleware]
    )
    image = {"type": "image", "url": "https://example.invalid/sky.png"}
    agent.invoke({"messages": [{"role": "user", "content": [image]}]})
    assert bound == [names, names]
    assert not middleware.shortlists and not middleware.feedback_results


def test_a_failed_report_is_kept_and_never_fails_the_run(
    tmp_path: Path, minilm_cache: Path, caplog
):
    """The service goes away while the tool runs (a server of its own, stopped by the tool), so
    the feedback cannot be sent: the run still ends with the model's answer."""
    from langchain.agents import create_agent

    from tests.server import Servers
    from tool_shortlist_client.adapters.langchain import ShortlistMiddleware
    from tool_shortlist_client.errors import TransportError

    servers = Servers(tmp_path, minilm_cache)
    try:
        doomed = servers.start()
        with ShortlistClient(doomed.url, registry="weather", retries=0) as client:
            client.put_registry("weather", weather_tools())
            calls: list[str] = []
            (tool,) = make_tools(["get_weather"], calls)
            inner = tool.func

            def run_and_stop(**kwargs: Any) -> str:
                doomed.stop()
                return inner(**kwargs)

            tool.func = run_and_stop
            middleware = ShortlistMiddleware(client, k=1)
            model = fake_model([], ["get_weather"])
            agent = create_agent(model, tools=[tool], middleware=[middleware])
            with caplog.at_level("WARNING", logger="tool_shortlist_client.adapters.langchain"):
                state = agent.invoke({"messages": [{"role": "user", "content": WEATHER_QUERY}]})
    finally:
        servers.close()

    assert state["messages"][-1].content == "Done." and calls == ["get_weather"]
    assert not middleware.feedback_results
    (error,) = middleware.feedback_errors
    assert isinstance(error, TransportError), error
    assert "not recorded" in caplog.text


def test_the_client_doc_snippet_runs_as_written(server):
    """docs/client.md's LangChain block, executed verbatim with the names it assumes bound."""
    calls: list[str] = []
    names = ["refund_payment", "create_invoice", "stripe__list_charges", "get_balance", "ask_human"]
    bound: list[list[str]] = []
    with ShortlistClient(server.url) as client:
        namespace: dict[str, Any] = {
            "client": client,
            "model": fake_model(bound, ["refund_payment"]),
            "all_tools": make_tools(names, calls),
        }
        exec(compile(client_doc_block("adapter:langchain"), "docs/client.md", "exec"), namespace)
        shortlist = namespace["shortlist"]
        assert shortlist.last.names[0] == "refund_payment"
        assert bound[0][0] == "refund_payment" and bound[0][-1] == "ask_human"
        assert len(bound[0]) < len(names)  # the shortlist, not the whole catalogue
        assert calls == ["refund_payment"]
        assert shortlist.feedback_results[-1].presented.exact
        assert tool_row(client.report("payments"), "refund_payment").used == 1


def test_the_agents_tools_scope_the_request_before_the_cap(server):
    """The middleware sends the agent's tools as allowed_tools (pins left out): with k=2 both
    slots go to tools the agent can call, never to registry tools it would drop. A name the
    registry lacks is refused once, then left out; a provider-safe name is sent decoded too."""
    import httpx
    from langchain.agents import create_agent

    from tool_shortlist_client.adapters.langchain import ShortlistMiddleware

    sent: list[dict[str, Any]] = []

    def record(request: httpx.Request) -> None:
        if request.url.path == "/shortlist":
            sent.append(json.loads(request.content))

    http = httpx.Client(event_hooks={"request": [record]})
    with ShortlistClient(server.url, registry="weather", http_client=http) as client:
        unscoped = client.shortlist("read the file and email it", k=2)
        assert "fs/read_file" in unscoped.names  # not an agent tool: it would waste a slot
        sent.clear()
        calls: list[str] = []
        tools = make_tools(["send_email", "get_weather", "local_only", "ask_human"], calls)
        bound: list[list[str]] = []
        middleware = ShortlistMiddleware(client, k=2, always_include=["ask_human"], reasks=0)  # re-asks: test_chains_e2e
        agent = create_agent(fake_model(bound, ["send_email"], ["get_weather"]), tools=tools,
                             middleware=[middleware])  # fmt: skip
        agent.invoke({"messages": [("user", "read the file and email it")]})
        agent.invoke({"messages": [("user", WEATHER_QUERY)]})
    http.close()

    assert sorted(middleware.shortlists[0].names) == ["get_weather", "send_email"]  # k=2, both usable
    assert sorted(bound[0]) == ["ask_human", "get_weather", "send_email"] and bound[0][-1] == "ask_human"
    assert [body.get("allowed_tools") for body in sent] == [
        ["send_email", "get_weather", "local_only"],  # refused by name (422) ...
        ["send_email", "get_weather"],  # ... and left out of this request
        ["send_email", "get_weather"],  # and of the next turn's
    ]
    assert calls == ["send_email", "get_weather"] and len(middleware.feedback_results) == 2

    sent.clear()
    with ShortlistClient(server.url, registry="weather", http_client=httpx.Client(event_hooks={"request": [record]})) as client:
        middleware = ShortlistMiddleware(client, k=1, scope_to_agent_tools=False, feedback=False)
        agent = create_agent(fake_model([], []), tools=make_tools(["get_weather"], []), middleware=[middleware])
        agent.invoke({"messages": [("user", WEATHER_QUERY)]})
    assert [("allowed_tools" in body) for body in sent] == [False]


def test_more_unknown_agent_tools_than_one_422_lists(server):
    """A 422 names at most 50 problems: 60 agent tools the registry lacks take two refusals."""
    import httpx
    from langchain.agents import create_agent

    from tool_shortlist_client.adapters.langchain import ShortlistMiddleware

    sent: list[dict[str, Any]] = []

    def record(request: httpx.Request) -> None:
        if request.url.path == "/shortlist":
            sent.append(json.loads(request.content))

    local = [f"local_{i}" for i in range(60)]
    http = httpx.Client(event_hooks={"request": [record]})
    with ShortlistClient(server.url, registry="weather", http_client=http) as client:
        middleware = ShortlistMiddleware(client, k=1, feedback=False)
        agent = create_agent(fake_model([], []), tools=make_tools(["get_weather", *local], []),
                             middleware=[middleware])  # fmt: skip
        agent.invoke({"messages": [("user", WEATHER_QUERY)]})
    http.close()
    assert middleware.last is not None and middleware.last.names == ["get_weather"]
    assert [len(body["allowed_tools"]) for body in sent] == [61, 11, 1]
