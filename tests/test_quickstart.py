"""The README's quick start, pasted as written: ``make run &`` in the background, the wait for
``/readyz``, a real MCP server's ``tools/list`` (npm's ``@modelcontextprotocol/server-filesystem``
over stdio) uploaded and shortlisted with curl; then the client installed into a virtualenv of its
own with the extra its code needs, and the Python block run there. Only the port, the scratch
paths and the virtualenv ``make`` uses (``VENV``, the one running these tests) differ."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def block(name: str) -> str:
    match = re.search(
        rf"<!-- quickstart:{name} -->\n```\w+\n(.*?)```\n<!-- /quickstart:{name} -->", README, re.S
    )
    assert match, f"README has no quickstart:{name} block"
    return match.group(1)


def test_the_quick_start_runs_as_written(minilm_cache: Path, tmp_path: Path) -> None:
    assert shutil.which("node") and shutil.which("npm"), "the quick start needs node and npm"
    port = free_port()
    base = f"localhost:{port}"
    shell = block("shell")
    assert shell.startswith("make run ") and "readyz" in shell
    script = shell.replace("localhost:8080", base).replace(".venv/", f"{sys.prefix}/")
    script = script.replace("/tmp/mcp", str(tmp_path / "mcp"))
    script = script.replace("shortlist.log", str(tmp_path / "shortlist.log"))
    env = dict(
        os.environ,
        VENV=sys.prefix,  # `make run` serves from the virtualenv these tests run in
        SHORTLIST_PORT=str(port),
        SHORTLIST_DATA_DIR=str(tmp_path / "data"),
        SHORTLIST_EMBEDDER_CACHE_DIR=str(minilm_cache),
    )
    # Its own process group: `make run &` and the server it starts are stopped with it.
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stdout + stderr
        harvested = json.loads((tmp_path / "mcp" / "filesystem.json").read_text())
        assert harvested["package"] == "@modelcontextprotocol/server-filesystem"
        # the two curl answers: the upload, then the shortlist, which ends the output
        decoder = json.JSONDecoder()
        text = stdout[stdout.index("{"):]
        upload, end = decoder.raw_decode(text)
        rest = text[end:].lstrip()
        shortlist, end = decoder.raw_decode(rest)
        assert rest[end:].strip() == ""
        assert upload["registry"] == "filesystem" and upload["tools"] == len(harvested["tools"])
        names = [tool["name"] for tool in shortlist["tools"]]
        assert 1 <= shortlist["k"] == len(names) < len(harvested["tools"])
        assert {"read_text_file", "read_file"} & set(names[:2]), names

        agent = tmp_path / "agent"
        install = block("client").replace("/tmp/agent", str(agent))
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", install], cwd=ROOT, env=clean,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        python = block("python").replace("localhost:8080", base)
        ran = subprocess.run([str(agent / "bin" / "python"), "-c", python], cwd=tmp_path, env=clean,
                             capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, ran.stderr
        first, second = ran.stdout.splitlines()[:2]
        assert first.startswith(f"{shortlist['k']} ") and names[0] in first
        assert "tool_reference" in second and names[0] in second
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
