"""Bearer tokens: who may write, query and read; 401s that say why; secrets that stay secret."""

from __future__ import annotations

import hmac
import logging
from typing import Any

from fastapi.testclient import TestClient
from pydantic import SecretStr

from registry.index.embed import HashingEmbedder
from service.app import create_app
from service.auth import token_matches
from service.settings import ServiceSettings

ADMIN = "admin-token-0123456789abcdef"
ADMIN_2 = "second-admin-token-0123456789"
QUERY = "query-token-0123456789abcdef"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_401(response: Any, reason: str) -> dict[str, Any]:
    assert response.status_code == 401, response.text
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    error = response.json()["error"]
    assert error["type"] == "unauthorized" and error["details"]["reason"] == reason
    for secret in (ADMIN, ADMIN_2, QUERY):
        assert secret not in response.text
    return error


def secure(make_client: Any, **tokens: Any) -> TestClient:
    return make_client(**{k: tuple(SecretStr(t) for t in v) for k, v in tokens.items()})


def test_open_by_default_with_a_startup_warning(make_client, tools_payload, caplog):
    with caplog.at_level(logging.WARNING, logger="service.auth"), make_client() as client:
        assert client.put("/registries/r", json=tools_payload).status_code == 200
        assert client.post("/shortlist", json={"registry": "r", "query": "mail"}).status_code == 200
        assert client.get("/registries/r").status_code == 200
        assert client.delete("/registries/r").status_code == 204
        spec = client.get("/openapi.json").json()
    assert "SHORTLIST_ADMIN_TOKEN is not set" in caplog.text and "unauthenticated" in caplog.text
    assert "securitySchemes" not in spec.get("components", {})  # the schema says what is true
    assert all("security" not in op for path in spec["paths"].values() for op in path.values())


def test_a_query_token_alone_says_at_start_up_that_writes_are_open(make_client, tools_payload, caplog):
    """Issue 23: with only a query token the operator may believe the service is closed."""
    with caplog.at_level(logging.WARNING, logger="service.auth"):
        client = secure(make_client, query_token=[QUERY])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = " ".join(r.getMessage() for r in warnings)
    assert "only SHORTLIST_QUERY_TOKEN is set" in message and "every write is open" in message
    for route in ("registry uploads and deletes", "refits", "activation", "wipes", "SHORTLIST_ADMIN_TOKEN"):
        assert route in message
    with client:  # what it says is true: queries are guarded, writes are not
        assert_401(client.post("/shortlist", json={"registry": "r", "query": "q"}), "missing_token")
        assert client.put("/registries/r", json=tools_payload).status_code == 200
        r = client.post("/registries/r/policies/default/activate", json={})
        assert r.status_code == 200
        assert client.delete("/registries/r/learning").status_code == 200
        assert client.delete("/registries/r").status_code == 204


def test_admin_token_guards_every_write(make_client, tools_payload, caplog):
    with caplog.at_level(logging.WARNING, logger="service.auth"):
        client = secure(make_client, admin_token=[ADMIN, ADMIN_2])
    assert "is not set" not in caplog.text
    with client:
        writes = [
            ("PUT", "/registries/r", tools_payload),
            ("POST", "/registries/r/tools", [{"name": "extra"}]),
            ("DELETE", "/registries/r/tools/extra", None),
            ("POST", "/registries/r/tools", [{"name": "extra"}]),
            ("DELETE", "/registries/r/tools?name=extra", None),
            ("DELETE", "/registries/r", None),
        ]
        for method, path, body in writes:
            error = assert_401(client.request(method, path, json=body), "missing_token")
            assert "Authorization: Bearer <token>" in error["message"]
            assert "admin token" in error["message"]
            assert_401(
                client.request(method, path, json=body, headers=bearer("nope")), "invalid_token"
            )
            for header in ("Basic YWRtaW46YWRtaW4=", "Bearer", "Bearer   ", ADMIN):
                r = client.request(method, path, json=body, headers={"Authorization": header})
                assert_401(r, "malformed_header")
            assert_401(
                client.request(method, path, json=body, headers=bearer(QUERY)), "invalid_token"
            )
        assert client.get("/registries").status_code == 401  # reads need a token too
        # Either admin token works, the scheme is case-insensitive, and nothing was written above.
        assert client.get("/registries", headers=bearer(ADMIN)).json() == {"registries": []}
        for method, path, body in writes:
            token = ADMIN if method != "DELETE" else ADMIN_2
            r = client.request(
                method, path, json=body, headers={"Authorization": f"bearer {token}"}
            )
            assert r.status_code in (200, 204), (method, path, r.text)
        # With no query tokens, queries stay open.
        client.put("/registries/r", json=tools_payload, headers=bearer(ADMIN))
        assert client.post("/shortlist", json={"registry": "r", "query": "mail"}).status_code == 200
        for path in ("/healthz", "/readyz", "/openapi.json"):
            assert client.get(path).status_code == 200, path
        # /metrics names every registry: it needs a token once tokens are configured.
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=bearer(ADMIN)).status_code == 200


def test_query_token_guards_queries_and_reads_and_admins_may_query(make_client, tools_payload):
    with secure(make_client, admin_token=[ADMIN], query_token=[QUERY]) as client:
        assert (
            client.put("/registries/r", json=tools_payload, headers=bearer(ADMIN)).status_code
            == 200
        )
        body = {"registry": "r", "query": "weather in Oslo"}
        assert_401(client.post("/shortlist", json=body), "missing_token")
        assert_401(client.post("/shortlist", json=body, headers=bearer("x" * 40)), "invalid_token")
        shortlist = client.post("/shortlist", json=body, headers=bearer(QUERY))
        assert shortlist.status_code == 200
        assert client.post("/shortlist", json=body, headers=bearer(ADMIN)).status_code == 200
        feedback = {"shortlist_id": shortlist.json()["shortlist_id"], "used": ["get_weather"]}
        assert_401(client.post("/feedback", json=feedback), "missing_token")
        assert client.post("/feedback", json=feedback, headers=bearer(QUERY)).status_code == 200
        for path in ("/registries", "/registries/r", "/registries/r/report"):
            assert_401(client.get(path), "missing_token")
            assert client.get(path, headers=bearer(QUERY)).status_code == 200
            assert client.get(path, headers=bearer(ADMIN)).status_code == 200
        # A query token never writes.
        assert_401(
            client.put("/registries/r", json=tools_payload, headers=bearer(QUERY)), "invalid_token"
        )
        assert_401(client.delete("/registries/r", headers=bearer(QUERY)), "invalid_token")


def test_auth_is_checked_before_the_body_is_read(make_client):
    with secure(make_client, admin_token=[ADMIN]) as client:
        r = client.put("/registries/r", content=b"not json", headers={"content-type": "text/plain"})
        assert_401(r, "missing_token")  # not 415 or 422: an anonymous caller learns nothing


def test_tokens_from_the_environment_comma_separated(monkeypatch, tmp_path, bor_policy):
    monkeypatch.setenv("SHORTLIST_ADMIN_TOKEN", f" {ADMIN} , {ADMIN_2},, ")
    monkeypatch.setenv("SHORTLIST_QUERY_TOKEN", QUERY)
    monkeypatch.setenv("SHORTLIST_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SHORTLIST_DEMO_REGISTRY", "")
    settings = ServiceSettings()
    assert [t.get_secret_value() for t in settings.admin_token] == [ADMIN, ADMIN_2]
    assert [t.get_secret_value() for t in settings.query_token] == [QUERY]
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        for secret in (ADMIN, ADMIN_2, QUERY):
            assert secret not in text
    app = create_app(
        settings,
        embedder_factory=lambda _: HashingEmbedder(),
        bor_policy=bor_policy,
        background_load=False,
    )
    with TestClient(app, base_url="http://localhost") as client:
        for token in (ADMIN, ADMIN_2):
            assert client.get("/registries", headers=bearer(token)).status_code == 200


def test_empty_token_variable_means_open(monkeypatch):
    monkeypatch.setenv("SHORTLIST_ADMIN_TOKEN", " , ")
    assert ServiceSettings().admin_token == ()


def test_every_configured_token_is_compared_in_constant_time(monkeypatch):
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    tokens = [SecretStr("first-token"), SecretStr("second"), SecretStr("third-token-longer")]
    assert token_matches("first-token", tokens)  # a match on the first token ...
    assert len(calls) == 3  # ... still compares all three: no early exit
    assert {len(a) for pair in calls for a in pair} == {32}  # digests: lengths leak nothing
    calls.clear()
    assert not token_matches("first-token-but-longer", tokens) and len(calls) == 3
    assert not token_matches("", tokens)
    assert not token_matches("anything", [])


def test_openapi_shows_the_bearer_schemes(make_client):
    with secure(make_client, admin_token=[ADMIN], query_token=[QUERY]) as client:
        spec = client.get("/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert schemes["AdminToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schemes["AdminToken"]["description"],
    }
    assert schemes["QueryToken"]["scheme"] == "bearer"
    paths = spec["paths"]
    for method, path in [
        ("put", "/registries/{registry}"),
        ("post", "/registries/{registry}/tools"),
        ("delete", "/registries/{registry}"),
        ("delete", "/registries/{registry}/tools/{name}"),
        ("delete", "/registries/{registry}/tools"),
    ]:
        assert paths[path][method]["security"] == [{"AdminToken": []}], (method, path)
    for method, path in [
        ("post", "/shortlist"),
        ("post", "/feedback"),
        ("get", "/registries"),
        ("get", "/registries/{registry}"),
        ("get", "/registries/{registry}/report"),
    ]:
        op = paths[path][method]
        assert sorted(op["security"], key=str) == [{"AdminToken": []}, {"QueryToken": []}], path
        assert "WWW-Authenticate" in op["responses"]["401"]["headers"]
    for path in ("/healthz", "/readyz"):
        assert "security" not in paths[path]["get"]
        assert "401" not in paths[path]["get"]["responses"]
    assert {"MetricsToken": []} in paths["/metrics"]["get"]["security"]


def test_reads_need_the_admin_token_when_only_admin_tokens_are_set(make_client):
    with secure(make_client, admin_token=[ADMIN]) as client:
        spec = client.get("/openapi.json").json()
        assert spec["paths"]["/registries"]["get"]["security"] == [{"AdminToken": []}]
        assert "security" not in spec["paths"]["/shortlist"]["post"]
        assert_401(client.get("/registries/r/report"), "missing_token")
