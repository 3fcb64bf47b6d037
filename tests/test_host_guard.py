"""DNS rebinding: every route answers only to the host names in SHORTLIST_ALLOWED_HOSTS (421
otherwise, as /mcp), and refuses requests a browser sent from a page of another host (403);
'*' turns both off for a service behind a proxy."""

from __future__ import annotations

import pytest

from service.middleware import host_name
from service.settings import ServiceSettings
from tests.conftest import weather_tools

EVIL = {"host": "evil.example.com", "origin": "http://evil.example.com"}
DEFAULT_HOSTS = ServiceSettings.model_fields["allowed_hosts"].default


@pytest.fixture
def local(make_client):
    """The default host names, reached as http://localhost:8080."""
    with make_client(allowed_hosts=DEFAULT_HOSTS) as client:
        client.base_url = "http://localhost:8080"
        yield client


def test_the_default_answers_to_localhost_names_only():
    assert set(ServiceSettings().allowed_hosts) == {"localhost", "127.0.0.1", "::1"}
    assert ServiceSettings(allowed_hosts="a.example, [::1] ,*").allowed_hosts == ("a.example", "::1", "*")
    assert [host_name(h) for h in ("LocalHost:8080", "[::1]:80", "::1", "x")] == ["localhost", "::1", "::1", "x"]


def test_a_rebound_host_cannot_write_or_read(local):
    assert local.put("/registries/x", json=weather_tools()).status_code == 200
    for method, path, body in (
        ("PUT", "/registries/x", weather_tools()),
        ("DELETE", "/registries/x", None),
        ("POST", "/shortlist", {"registry": "x", "query": "weather"}),
        ("GET", "/registries/x", None),
        ("GET", "/healthz", None),
        ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    ):
        r = local.request(method, path, json=body, headers=EVIL)
        assert r.status_code == 421, (method, path, r.status_code, r.text)
        assert r.json()["error"]["type"] == "misdirected_request"
        assert "SHORTLIST_ALLOWED_HOSTS" in r.json()["error"]["message"]
    assert local.get("/registries/x").json()["version"] == 1  # nothing changed


def test_a_foreign_origin_is_refused_with_a_local_host(local):
    r = local.delete("/registries/x", headers={"origin": "http://evil.example.com"})
    assert r.status_code == 403 and r.json()["error"]["type"] == "forbidden_origin"
    same = local.put("/registries/x", json=weather_tools(), headers={"origin": "http://localhost:8080"})
    assert same.status_code == 200  # the console's own page writes with its own origin
    for host in ("127.0.0.1:8080", "[::1]:8080"):
        assert local.get("/healthz", headers={"host": host}).status_code == 200


def test_a_request_without_host_is_no_rebinding(local):
    """HTTP/1.0 health checkers may send no Host; a browser always sends one."""
    import asyncio

    from service.middleware import HostGuardMiddleware

    seen = []

    async def app(scope, receive, send):
        seen.append(scope["path"])

    guard = HostGuardMiddleware(app, ("localhost",))
    asyncio.run(guard({"type": "http", "path": "/healthz", "headers": []}, None, None))
    assert seen == ["/healthz"]


def test_a_star_answers_every_host(make_client):
    with make_client(allowed_hosts=("*",)) as client:
        assert client.put("/registries/x", json=weather_tools(), headers=EVIL).status_code == 200
