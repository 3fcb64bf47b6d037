"""examples/openai_agents.py against a real server, through the real Agents SDK runner: a scripted
``agents.Model`` (the SDK's interface for custom models) stands in for OpenAI's and calls the first
tool the Agent gives it, then answers."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import weather_tools
from tool_shortlist_client import AsyncShortlistClient, ShortlistClient
from tool_shortlist_client.names import provider_name

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "openai_agents.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("openai_agents_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _scripted_model() -> Any:
    from agents import Model, ModelResponse, Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class CallsTheFirstTool(Model):
        """Turn 1: calls the first tool it is given; turn 2: answers with that tool's output."""

        def __init__(self) -> None:
            self.tools_seen: list[list[str]] = []

        async def get_response(self, system_instructions, input, model_settings, tools, output_schema,
                               handoffs, tracing, *, previous_response_id=None, conversation_id=None,
                               prompt=None) -> ModelResponse:  # fmt: skip
            self.tools_seen.append([tool.name for tool in tools])
            if len(self.tools_seen) == 1:
                item: Any = ResponseFunctionToolCall(
                    type="function_call", id="fc_1", call_id="call_1", name=tools[0].name,
                    arguments=json.dumps({"path": "notes.md"}), status="completed",
                )  # fmt: skip
            else:
                output = next(i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output")
                item = ResponseOutputMessage(
                    type="message", id="msg_1", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text=f"Done: {output['output']}",
                                                annotations=[])],
                )  # fmt: skip
            return ModelResponse(output=[item], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the example does not stream")

    return CallsTheFirstTool()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path):
    from tests.server import Servers

    servers = Servers(tmp_path_factory.mktemp("agents-example"), minilm_cache)
    started = servers.start()
    with ShortlistClient(started.url) as admin:
        admin.put_registry("files", weather_tools())
    yield started
    servers.close()


def test_the_example_answers_with_the_shortlisted_tools(server) -> None:
    example = _example()
    model = _scripted_model()

    async def run() -> Any:
        async with AsyncShortlistClient(server.url) as client:
            return await example.answer(client, "read the file notes.md from disk", registry="files", model=model)

    out = asyncio.run(run())
    shortlist = out.shortlist
    assert shortlist.names[0] == "fs/read_file" and shortlist.k == len(shortlist.names)
    # The model saw exactly the shortlist, best first, under provider-safe names.
    assert model.tools_seen[0] == [provider_name(name) for name in shortlist.names]
    assert model.tools_seen[0][0] == "fs__read_file"
    # The runner ran the tool under its registry name; its output reached the answer.
    assert out.called == ["fs/read_file"]
    assert out.text == 'Done: fs/read_file ran with {"path": "notes.md"}'
    with ShortlistClient(server.url) as client:
        row = next(tool for tool in client.report("files").tools if tool.name == "fs/read_file")
    assert row.used == 1


def test_the_example_has_a_command_line() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--registry" in proc.stdout and "only the tools the service shortlists" in " ".join(proc.stdout.split())
