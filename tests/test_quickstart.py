"""The README's quick start, run as written: a real MCP server's ``tools/list`` (npm's
``@modelcontextprotocol/server-filesystem`` over stdio) uploaded and shortlisted with curl, then
the same through the Python client and the Anthropic adapter. A test server stands in for
``make run`` (the one line not run); every other line runs verbatim bar the port."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def block(name: str) -> str:
    match = re.search(
        rf"<!-- quickstart:{name} -->\n```\w+\n(.*?)```\n<!-- /quickstart:{name} -->", README, re.S
    )
    assert match, f"README has no quickstart:{name} block"
    return match.group(1)


def test_the_quick_start_runs_as_written(server_factory, tmp_path: Path) -> None:
    assert shutil.which("node") and shutil.which("npm"), "the quick start needs node and npm"
    server = server_factory()
    base = f"127.0.0.1:{server.port}"
    shell = block("shell")
    lines = shell.splitlines()
    assert lines[0].startswith("make run &")
    script = "\n".join(lines[1:])
    script = script.replace("localhost:8080", base).replace(".venv/bin/python", sys.executable)
    script = script.replace("/tmp/mcp", str(tmp_path / "mcp"))
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    harvested = json.loads((tmp_path / "mcp" / "filesystem.json").read_text())
    assert harvested["package"] == "@modelcontextprotocol/server-filesystem"
    # the two curl answers: the upload, then the shortlist
    decoder = json.JSONDecoder()
    text = proc.stdout[proc.stdout.index("{"):]
    upload, end = decoder.raw_decode(text)
    shortlist, _ = decoder.raw_decode(text[end:].lstrip())
    assert upload["registry"] == "filesystem" and upload["tools"] == len(harvested["tools"])
    names = [tool["name"] for tool in shortlist["tools"]]
    assert 1 <= shortlist["k"] == len(names) < len(harvested["tools"])
    assert {"read_text_file", "read_file"} & set(names[:2]), names

    python = block("python").replace("localhost:8080", base)
    ran = subprocess.run([sys.executable, "-c", python], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    first, second = ran.stdout.splitlines()[:2]
    assert first.startswith(f"{shortlist['k']} ") and names[0] in first
    assert "tool_reference" in second and names[0] in second
