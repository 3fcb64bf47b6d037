"""Issue 13 item 5: stale series after a delete, the feedback 422 message, JSON-RPC uploads,
and ``--help`` without reStructuredText and with defaults."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from registry.errors import InvalidToolDefinition
from registry.tools import parse_tools
from tests.conftest import ROOT
from tests.test_api import assert_error


def _series(text: str, registry: str) -> list[str]:
    return [line for line in text.splitlines() if f'registry="{registry}"' in line and not line.startswith("#")]


def test_delete_registry_removes_its_metric_series(client, tools_payload):
    for name in ("gone", "kept"):
        client.put(f"/registries/{name}", json=tools_payload)
        sl = client.post("/shortlist", json={"registry": name, "query": "weather in Paris"}).json()
        client.post("/shortlist", json={"registry": name, "query": "weather", "policy": "fixed", "k": 2})
        assert client.post("/feedback", json={"shortlist_id": sl["shortlist_id"], "used": ["get_weather"]}).status_code == 200
    before = client.get("/metrics").text
    names = {line.split("{")[0] for line in _series(before, "gone")}
    for expected in (
        "shortlist_requests_total", "shortlist_k_bucket", "shortlist_k_count", "shortlist_registry_tools",
        "shortlist_registry_version", "shortlist_feedback_total", "shortlist_presented_total",
        "shortlist_feedback_p_rand_sum", "shortlist_presentation_rate", "shortlist_live_bor_bits",
    ):
        assert expected in names, expected
    assert client.delete("/registries/gone").status_code in (200, 204)
    after = client.get("/metrics").text
    assert _series(after, "gone") == []
    assert {line.split("{")[0] for line in _series(after, "kept")} == names  # the other one stays
    # The registry can come back; its series start again from zero.
    client.put("/registries/gone", json=tools_payload)
    again = client.get("/metrics").text
    assert 'shortlist_feedback_total{registry="gone"} 0.0' in again
    assert 'shortlist_registry_tools{registry="gone"} 4.0' in again
    assert "shortlist_requests_total{" not in "\n".join(_series(again, "gone"))


def test_feedback_422_message_names_the_problems(client, tools_payload):
    client.put("/registries/r", json=tools_payload)
    sl = client.post("/shortlist", json={"registry": "r", "query": "weather"}).json()
    error = assert_error(
        client.post("/feedback", json={"shortlist_id": sl["shortlist_id"], "used": ["get_weather", "ghost"]}),
        422, "validation",
    )
    assert error["message"].startswith("invalid feedback: 1 problem(s): ")
    assert "used[1]: tool 'ghost' does not exist in registry 'r'" in error["message"]
    assert error["details"][0]["tool"] == "ghost"
    many = [f"ghost{i}" for i in range(8)]
    error = assert_error(
        client.post("/feedback", json={"shortlist_id": sl["shortlist_id"], "used": many}), 422, "validation"
    )
    assert error["message"].count("does not exist") == 5 and error["message"].endswith("(and 3 more)")
    assert len(error["details"]) == 8


MCP_TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city",
     "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"name": "send_email", "description": "Send an email", "inputSchema": {"type": "object", "properties": {}}},
]


def test_a_jsonrpc_tools_list_response_is_unwrapped(client):
    envelope = {"jsonrpc": "2.0", "id": 7, "result": {"tools": MCP_TOOLS, "nextCursor": None}}
    assert [t.name for t in parse_tools(envelope)] == ["get_weather", "send_email"]
    r = client.put("/registries/mcp", json=envelope)
    assert r.status_code == 200, r.text
    assert r.json()["tools"] == 2
    assert client.post("/shortlist", json={"registry": "mcp", "query": "weather in Oslo"}).json()["tools"][0]["name"] == "get_weather"


@pytest.mark.parametrize(
    ("payload", "field", "says"),
    [
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "Method not found"}},
         "error", "JSON-RPC error response"),
        ({"jsonrpc": "2.0", "id": 1, "result": {"resources": []}}, "result", 'without a "tools" key'),
        ({"jsonrpc": "2.0", "id": 1, "result": None}, "result", "got null"),
    ],
)
def test_a_jsonrpc_response_without_tools_is_refused_clearly(client, payload, field, says):
    with pytest.raises(InvalidToolDefinition) as caught:
        parse_tools(payload)
    assert caught.value.details[0]["field"] == field and says in caught.value.message
    error = assert_error(client.put("/registries/x", json=payload), 422, "validation")
    assert says in error["message"]


def test_a_plain_object_with_tools_is_unchanged_by_the_unwrap():
    assert [t.name for t in parse_tools({"jsonrpc": "2.0", "tools": MCP_TOOLS})] == ["get_weather", "send_email"]


def _help(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", *args, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("command", [(), ("serve",), ("episodes",), ("refit",), ("train",), ("evaluate",)])
def test_cli_help_has_no_restructuredtext(command):
    text = _help(*command)
    assert "``" not in text and not re.search(r":(func|class|mod|meth):`", text), text


def _options(parser_help: str) -> dict[str, str]:
    """``--option`` -> its help text (joined lines) from an argparse --help page."""
    out: dict[str, str] = {}
    current = None
    for line in parser_help.split("options:", 1)[1].splitlines():
        match = re.match(r"\s{2}(-[-\w]+(?:, --[\w-]+)?)(?:\s[^ ].*?)?(?:\s{2,}(.*))?$", line)
        if match and line.startswith("  -"):
            current = match.group(1).split(", ")[-1]
            out[current] = match.group(2) or ""
        elif current:
            out[current] += " " + line.strip()
    return out


@pytest.mark.parametrize("command", ["train", "episodes", "evaluate"])
def test_every_option_has_help_and_its_default(command, monkeypatch):
    if command == "train":
        from registry.offline.train_cli import main as entry
    elif command == "evaluate":
        from registry.offline.evaluate_cli import main as entry
    text = _help(command)
    options = _options(text)
    assert len(options) > 5
    for option, help_text in options.items():
        if option == "--help":
            continue
        assert help_text.strip(), f"{command} {option} has no help"
    if command == "episodes":
        return
    # Every option with a value default says it, checked against the real parser's defaults.
    captured: dict[str, argparse.ArgumentParser] = {}

    def grab(self, *args, **kwargs):
        captured["parser"] = self
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    with pytest.raises(SystemExit):
        entry([])
    for action in captured["parser"]._actions:
        if not action.option_strings or action.default in (None, False, [], argparse.SUPPRESS):
            continue
        flag = action.option_strings[-1]
        assert "default" in options[flag], f"{command} {flag}: {options[flag]!r}"
