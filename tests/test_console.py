"""The console's server side through TestClient: pages and assets, offline docs HTML, the live
window endpoint, last-write times and the opt-in depth margins (``explain``).

The page itself is exercised in a real browser by tests/test_console_browser.py.
"""

from __future__ import annotations

import math
import re
import time

import numpy as np
import pytest

from registry.serving.depth_policies import first_stop
from registry.settings import Settings
from service.routes.console import CONSOLE_DIR


def test_root_redirects_to_the_console_and_the_page_and_assets_are_served(client):
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/console"
    page = client.get("/console")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assets = re.findall(r'(?:src|href)="(/console/assets/[^"]+)"', page.text)
    assert sorted(assets) == ["/console/assets/app.js", "/console/assets/style.css"]
    for path in assets:
        served = client.get(path)
        assert served.status_code == 200
        assert served.content == (CONSOLE_DIR / path.rsplit("/", 1)[1]).read_bytes()
    # nothing on the page is fetched from another host
    assert not re.search(r'(?:src|href)="(?:https?:)?//', page.text)
    assert client.get("/console/assets/missing.js").status_code == 404


def test_the_console_refuses_framing_and_runs_only_its_own_script(client):
    """Issue 23: no CSP, no frame headers (a clickjacked delete), and HEAD /console was 405."""
    page = client.get("/console")
    csp = dict(part.strip().split(" ", 1) for part in page.headers["content-security-policy"].split(";"))
    assert csp["default-src"] == "'none'" and csp["frame-ancestors"] == "'none'"
    assert csp["script-src"] == "'self'" and "unsafe" not in page.headers["content-security-policy"]
    assert csp["connect-src"] == "'self'" and csp["base-uri"] == "'none'"
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    # the policy fits the page: no inline script, style or handler it would block
    assert not re.search(r"<script(?![^>]*\bsrc=)|<style|\sstyle=|\son[a-z]+=", page.text)
    for path in ("/docs", "/redoc"):
        docs = client.get(path)
        assert docs.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in docs.headers["content-security-policy"]


@pytest.mark.parametrize("path", ["/console", "/docs", "/redoc", "/"])
def test_head_answers_like_get_without_a_body(client, path):
    got = client.get(path, follow_redirects=False)
    head = client.head(path, follow_redirects=False)
    assert head.status_code == got.status_code and head.status_code in (200, 307)
    assert head.content == b""
    for name in ("content-type", "content-security-policy", "x-frame-options", "location"):
        assert head.headers.get(name) == got.headers.get(name), name


@pytest.mark.parametrize(
    ("path", "assets"),
    [
        ("/docs", ["/docs-assets/swagger-ui.css", "/docs-assets/swagger-ui-bundle.js"]),
        ("/redoc", ["/docs-assets/redoc.js"]),
    ],
)
def test_api_docs_load_their_assets_from_this_service(client, path, assets):
    page = client.get(path)
    assert page.status_code == 200
    for asset in assets:
        assert f'"{asset}"' in page.text
        served = client.get(asset)
        assert served.status_code == 200 and len(served.content) > 100_000
    assert "cdn." not in page.text and "fonts.googleapis" not in page.text
    assert "validatorUrl" in page.text or path == "/redoc"  # Swagger's badge calls out otherwise
    assert path not in client.get("/openapi.json").json()["paths"]
    if path == "/redoc":  # the bundle's one hard-coded outside URL (its logo) points here
        bundle = client.get("/docs-assets/redoc.js").content
        assert b"cdn.redoc.ly" not in bundle and b"/docs-assets/favicon.png" in bundle


def test_registries_report_when_each_version_was_written(make_client, settings, tools_payload):
    with make_client() as client:
        before = time.time()
        written = client.put("/registries/w", json=tools_payload).json()["written_at"]
        assert before <= written <= time.time()
        listed = client.get("/registries").json()["registries"]
        assert listed == [{"registry": "w", "version": 1, "tools": 4, "written_at": written}]
        assert client.get("/registries/w").json()["written_at"] == written
        later = client.delete("/registries/w/tools/send_email")
        assert later.status_code == 204
        newer = client.get("/registries/w").json()["written_at"]
        assert newer > written
    # durable: a restart reads the time back from the store, it does not stamp the load time
    with make_client() as client:
        assert client.get("/registries").json()["registries"][0]["written_at"] == newer


def test_live_endpoint_reports_the_window_the_gauges_read(client, tools_payload):
    client.put("/registries/w", json=tools_payload)
    empty = client.get("/registries/w/live").json()
    assert empty["exact"] == {
        "events": 0, "presented": 0, "presentation_rate": None, "mean_p_rand": None, "bor_bits": None
    }
    hit = client.post("/shortlist", json={"registry": "w", "query": "weather in Oslo", "k": 1}).json()
    client.post("/feedback", json={"shortlist_id": hit["shortlist_id"], "used": [hit["tools"][0]["name"]]})
    miss = client.post("/shortlist", json={"registry": "w", "query": "weather in Oslo", "k": 2}).json()
    shown = {t["name"] for t in miss["tools"]}
    unused = next(t["name"] for t in client.get("/registries/w").json()["tools"] if t.get("name") not in shown and "function" not in t)
    client.post("/feedback", json={"shortlist_id": miss["shortlist_id"], "used": [unused]})
    live = client.get("/registries/w/live").json()
    exact = live["exact"]
    assert (exact["events"], exact["presented"]) == (2, 1)
    assert exact["presentation_rate"] == 0.5
    assert exact["mean_p_rand"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert exact["bor_bits"] == pytest.approx(math.log2(0.5 / 0.375))
    assert live["window_seconds"] == Settings().live_window_seconds
    assert client.get("/registries/nope/live").status_code == 404


def test_explain_returns_the_margins_the_bor_policy_stopped_on(make_client):
    tools = [
        {"name": f"tool_{i}", "description": f"{word} things for the user"}
        for i, word in enumerate("weather mail calendar money files notes tasks maps music news".split())
    ]
    with make_client(explore_share=0.0) as client:  # no exploration: shown == chosen == k
        client.put("/registries/r", json=tools)
        query = {"registry": "r", "query": "check the weather"}
        plain = client.post("/shortlist", json=query).json()
        assert "explain" not in plain  # opt-in: default responses are unchanged
        depths = set()
        for bias in (-2.0, 0.0, 0.5, 9.0):
            body = client.post("/shortlist", json={**query, "explain": True, "depth_bias": bias}).json()
            explained = body["explain"]
            assert len(explained["margins"]) == 5  # policy_depth_limit(10): the deepest it weighs
            assert explained["bias"] == bias
            assert explained["chosen"] == explained["shown"] == body["k"]
            assert body["k"] == first_stop(np.array([[m, 0.0] for m in explained["margins"]]), bias)
            depths.add(body["k"])
        assert len(depths) > 1  # the bias moved the depth, and the margins said where
        for other in ({"policy": "gap"}, {"k": 3}):
            assert "explain" not in client.post("/shortlist", json={**query, **other, "explain": True}).json()
        for loose in ("yes please", 0, 1, "true"):  # strict: only true or false
            assert client.post("/shortlist", json={**query, "explain": loose}).status_code == 422
