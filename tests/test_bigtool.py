"""The LangGraph bigtool adapter against a real server, in a virtualenv of its own.

``pip install './client[bigtool]'`` pins langgraph 1.0.1 (bigtool 0.0.3 needs it), while the test
environment holds the newest LangChain the other extras allow; so the client is installed with that
extra into a fresh virtualenv and ``tests/bigtool_agent.py`` runs the agents there, printing what
each saw: the sync and async graphs, a uuid-keyed tool registry, provider-safe tool names mapped
back to registry names, and the bigtool block of docs/client.md as written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import weather_tools
from tests.doc_examples import client_doc_block
from tests.test_langchain_middleware import PAYMENTS
from tool_shortlist_client import ShortlistClient

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path) -> dict[str, Any]:
    from tests.server import Servers

    base = tmp_path_factory.mktemp("bigtool")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "./client[bigtool]"],
        cwd=ROOT, env=clean, capture_output=True, text=True, timeout=600,
    )
    assert install.returncode == 0, install.stderr
    block = base / "bigtool_block.py"
    block.write_text(client_doc_block("adapter:bigtool"))
    servers = Servers(base, minilm_cache)
    try:
        server = servers.start()
        with ShortlistClient(server.url) as admin:
            admin.put_registry("weather", weather_tools())
            admin.put_registry("payments", PAYMENTS)
        ran = subprocess.run(
            [str(venv / "bin" / "python"), str(ROOT / "tests" / "bigtool_agent.py"), server.url, str(block)],
            cwd=base, env=clean, capture_output=True, text=True, timeout=600,
        )
    finally:
        servers.close()
    assert ran.returncode == 0, ran.stderr
    result: dict[str, Any] = json.loads(ran.stdout.strip().splitlines()[-1])
    versions = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('langgraph'))"],
        capture_output=True, text=True, env=clean, check=True,
    )
    result["langgraph"] = versions.stdout.strip()
    return result


def test_the_extra_installs_the_langgraph_bigtool_needs(observed: dict[str, Any]) -> None:
    assert observed["langgraph"] == "1.0.1"


def test_the_sync_graph_retrieves_through_the_service(observed: dict[str, Any]) -> None:
    seen = observed["sync"]
    assert seen["names"][0] == "get_weather"
    assert seen["selected"] == seen["names"]  # what /shortlist chose, in order
    assert seen["bound"][0] == ["retrieve_tools"]  # the model starts with the retrieval tool only
    assert seen["bound"][1] == ["retrieve_tools", *seen["names"]]
    assert seen["calls"] == ["get_weather"] and "get_weather" in seen["retrieved"]
    assert seen["answer"] == "Sunny in Paris." and seen["feedback_exact"]


def test_a_uuid_keyed_registry_maps_by_tool_name(observed: dict[str, Any]) -> None:
    seen = observed["uuid"]
    assert seen["ids_known"] and seen["first_tool"] == seen["first_name"] == "get_weather"
    assert "none of the shortlisted tools" in seen["unrelated"]


def test_the_async_graph(observed: dict[str, Any]) -> None:
    assert observed["async"]["selected"][0] == "get_weather"
    assert observed["async"]["calls"] == ["get_weather"]


def test_provider_safe_tool_names_map_back_to_registry_names(observed: dict[str, Any]) -> None:
    """The LangChain tool ``stripe__list_charges`` is the registry's ``stripe/list_charges``
    (before: ValueError, none of the shortlisted tools ['stripe/list_charges'] is in tool_ids)."""
    seen = observed["provider_names"]
    assert seen["names"][0] == "stripe/list_charges"
    assert seen["selected"][0] == "stripe__list_charges"
    assert "stripe/list_charges" not in seen["selected"]
    assert seen["bound"][1][:2] == ["retrieve_tools", "stripe__list_charges"]
    assert seen["calls"] == ["stripe__list_charges"]


def test_the_client_doc_block(observed: dict[str, Any]) -> None:
    seen = observed["doc"]
    assert seen["names"][0] == "refund_payment"
    assert seen["bound"][1][:2] == ["retrieve_tools", "refund_payment"]
    assert seen["calls"] == ["refund_payment"]
