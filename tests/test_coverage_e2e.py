"""The coverage refinement on a real server (real MiniLM, the shipped ONNX depth policy): a
configured model extends the default list over HTTP, never past half the registry, leaves a
fixed ``k`` alone, and a corrupt model file keeps the server unready with /readyz naming it.
(tests/test_coverage.py covers the same with the hashing embedder in-process.)"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.test_coverage import _model, _tools

pytestmark = pytest.mark.e2e

QUERY = "weather forecast for Paris"


@pytest.fixture(scope="module")
def servers(tmp_path_factory, minilm_cache):
    from tests.server import Servers

    base = tmp_path_factory.mktemp("coverage")
    always = base / "always.json"
    _model({}, 10.0, tau_add=0.5, tau_drop=0.0).save(always)
    bad = base / "bad.json"
    bad.write_text("{not json")
    started = Servers(base, minilm_cache)
    plain = started.start(data_dir=base / "plain")
    wide = started.start(data_dir=base / "wide", coverage_model=str(always))
    broken = started.start(data_dir=base / "broken", coverage_model=str(bad), wait=False)
    for server in (plain, wide):
        r = httpx.put(f"{server.url}/registries/r", json={"tools": _tools(12)}, timeout=300)
        assert r.status_code == 200, r.text
    yield plain, wide, broken
    started.close()


def _names(url: str, **body) -> list[str]:
    r = httpx.post(f"{url}/shortlist", json={"registry": "r", "query": QUERY, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return [t["name"] for t in r.json()["tools"]]


def test_a_configured_model_extends_the_list_over_http_up_to_half_the_registry(servers):
    plain, wide, _ = servers
    base, extended = _names(plain.url), _names(wide.url)
    assert len(extended) == 6 > len(base)  # half of 12 tools: never more
    assert extended[: len(base)] == base  # the refinement appends; the ranking is the same
    assert len(_names(wide.url, k=4)) == 4  # a fixed k is exactly k


def test_a_corrupt_model_keeps_the_server_unready_and_readyz_names_the_file(servers):
    *_, broken = servers
    deadline, r = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{broken.url}/readyz", timeout=2)
            if "bad.json" in r.text:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    assert r is not None and r.status_code == 503, r and r.text
    assert "bad.json" in r.text and "coverage_loso.py" in r.text
    assert httpx.post(f"{broken.url}/shortlist", json={"registry": "r", "query": QUERY}, timeout=30).status_code == 503
