"""An OpenAI Agents SDK agent that sees, on each request, only the tools the service shortlists.

    python3 -m venv /tmp/agent && /tmp/agent/bin/pip install -q './client[openai]'
    OPENAI_API_KEY=... /tmp/agent/bin/python examples/openai_agents.py \\
        --registry filesystem "show me the first lines of notes.txt"

For each request: ``/shortlist`` chooses the tools (as many as the depth policy judges the request
needs), the Agent gets them as function tools under provider-safe names (``filesystem/read_file``
goes out as ``filesystem__read_file``; the runner hands the registry name back to ``run_tool``),
``Runner.run`` answers, and the tools the model called go to ``/feedback``. ``run_tool`` is a
stand-in: call your MCP session or your functions there. tests/test_openai_agents_example.py runs
``answer`` against a real server with a scripted model in place of OpenAI's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agents import Agent, Model, RunConfig, Runner

from tool_shortlist_client import AsyncShortlistClient, Shortlist
from tool_shortlist_client.adapters.openai import agents_tools

ToolRunner = Callable[[str, dict[str, Any]], Awaitable[Any]]


async def run_tool(name: str, arguments: dict[str, Any]) -> str:
    """Stand-in executor: ``name`` is the registry's tool name."""
    return f"{name} ran with {json.dumps(arguments, sort_keys=True)}"


@dataclass
class Answer:
    text: str
    shortlist: Shortlist
    called: list[str]  # registry names, in call order


async def answer(
    client: AsyncShortlistClient,
    request: str,
    *,
    registry: str,
    model: str | Model = "gpt-5-mini",
    run: ToolRunner = run_tool,
) -> Answer:
    """One request: shortlist, run the Agent on the shortlisted tools, report what it called."""
    shortlist = await client.shortlist(request, registry=registry)
    called: list[str] = []

    async def call(name: str, arguments: dict[str, Any]) -> Any:
        called.append(name)
        return await run(name, arguments)

    agent = Agent(
        name="assistant",
        instructions="Answer the request, calling the tools you are given when they help.",
        model=model,
        tools=list(agents_tools(shortlist.definitions, call)),
    )
    result = await Runner.run(agent, request, run_config=RunConfig(tracing_disabled=True))
    await client.feedback(shortlist, used=called, success=True)
    return Answer(str(result.final_output), shortlist, called)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("request", help="what the user asks")
    parser.add_argument("--url", default="http://localhost:8080", help="the tool-shortlist service")
    parser.add_argument("--registry", default="filesystem", help="the registry to shortlist from")
    parser.add_argument("--model", default="gpt-5-mini", help="OpenAI model (needs OPENAI_API_KEY)")
    args = parser.parse_args()
    async with AsyncShortlistClient(args.url) as client:
        out = await answer(client, args.request, registry=args.registry, model=args.model)
    print(f"shortlist ({out.shortlist.k}): {out.shortlist.names}")
    print(f"called: {out.called}")
    print(out.text)


if __name__ == "__main__":
    asyncio.run(main())
