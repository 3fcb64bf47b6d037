"""Regressions from the adversarial pass (issue 14 items 4 and 7): lone surrogates in error
bodies, and a strictly typed `k` that is never silently combined with another policy."""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr

from tests.test_api import assert_error


def put_raw(client, name: str, body: bytes):
    return client.put(f"/registries/{name}", content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    "body",
    [
        b'[{"name": "a\\ud800b", "description": "x"}]',
        b'[{"name": "ok", "description": "bad \\udfff text"}]',
        b'{"tools": [{"name": "ok", "description": "x"}], "equivalents": [["ok", "\\udc00"]]}',
    ],
)
def test_a_lone_surrogate_is_a_422_that_names_the_problem(client, body):
    r = put_raw(client, "odd", body)
    assert_error(r, 422, "validation")
    json.loads(r.content.decode("ascii"))  # escaped, so the body always encodes
    assert client.get("/registries/odd").status_code == 404  # nothing was written


def test_feedback_naming_a_surrogate_tool_is_a_4xx(client, tools_payload):
    client.put("/registries/r", json=tools_payload)
    sid = client.post("/shortlist", json={"registry": "r", "query": "weather"}).json()["shortlist_id"]
    r = client.post(
        "/feedback",
        content=b'{"shortlist_id": "' + sid.encode() + b'", "used": ["\\ud800"]}',
        headers={"content-type": "application/json"},
    )
    assert 400 <= r.status_code < 500, r.text


@pytest.mark.parametrize("k", [True, "5", 2.0])
def test_k_must_be_an_integer(client, tools_payload, k):
    client.put("/registries/r", json=tools_payload)
    r = client.post("/shortlist", json={"registry": "r", "query": "weather", "k": k})
    assert_error(r, 422, "validation")
    assert "k" in [d["field"] for d in r.json()["error"]["details"]]


@pytest.mark.parametrize("policy", ["gap", "bor", "threshold"])
def test_k_with_another_policy_is_refused_not_ignored(client, tools_payload, policy):
    client.put("/registries/r", json=tools_payload)
    r = client.post("/shortlist", json={"registry": "r", "query": "weather", "k": 3, "policy": policy})
    assert_error(r, 422, "validation")
    assert [d["field"] for d in r.json()["error"]["details"]] == ["k"]
    ok = client.post("/shortlist", json={"registry": "r", "query": "weather", "k": 3, "policy": "fixed"})
    assert ok.status_code == 200 and ok.json()["k"] == 3


@pytest.mark.parametrize("suffix", ["\xa0", "\x85", "\u2003"])
def test_a_token_with_unicode_whitespace_is_not_the_token(suffix):
    from service.auth import authenticate
    from service.errors import Unauthorized

    accepted = (SecretStr("s3cret"),)
    authenticate("Bearer s3cret \t", accepted, "a query token")  # HTTP's own whitespace is fine
    with pytest.raises(Unauthorized) as err:
        authenticate("Bearer s3cret" + suffix, accepted, "a query token")
    assert err.value.details["reason"] == "invalid_token"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_bodies_that_are_not_utf8_are_a_422(client, tools_payload, encoding):
    client.put("/registries/r", json=tools_payload)
    query = json.dumps({"registry": "r", "query": "weather"}).encode(encoding)
    r = client.post("/shortlist", content=query, headers={"content-type": "application/json"})
    assert_error(r, 422, "validation")
    assert "UTF-8" in r.json()["error"]["message"]
    tools = json.dumps([{"name": "x", "description": "y"}]).encode(encoding)
    assert_error(put_raw(client, "utf16", tools), 422, "validation")
    assert client.get("/registries/utf16").status_code == 404
    bom = b"\xef\xbb\xbf" + json.dumps({"registry": "r", "query": "weather"}).encode()
    ok = client.post("/shortlist", content=bom, headers={"content-type": "application/json"})
    assert ok.status_code == 200, ok.text  # a UTF-8 byte-order mark is tolerated


# -- issue 14 item 8: Allow, %2f, /metrics, and a schema as strict as the validation --------------


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PATCH", "/registries/r", {"GET", "PUT", "DELETE"}),
        ("POST", "/registries/r", {"GET", "PUT", "DELETE"}),
        ("PUT", "/registries/r/tools", {"POST", "DELETE"}),
        ("GET", "/shortlist", {"POST"}),
        ("GET", "/registries/r/tools/fs/read_file", {"DELETE"}),
    ],
)
def test_a_405_allows_every_method_of_the_path(client, method, path, allowed):
    r = client.request(method, path)
    assert_error(r, 405, "method_not_allowed")
    assert {m.strip() for m in r.headers["allow"].split(",")} == allowed
    for other in allowed:  # each listed method is really served (not a 405)
        assert client.request(other, path, json=[]).status_code != 405, other


def test_a_registry_name_with_an_encoded_slash_is_not_redirected(client, tools_payload):
    r = client.put("/registries/demo%2f", json=tools_payload, follow_redirects=False)
    assert r.status_code == 404, (r.status_code, r.headers)
    assert client.get("/registries/demo", follow_redirects=False).status_code == 404  # not written
    assert client.get("/registries/", follow_redirects=False).status_code == 404


@pytest.mark.parametrize(
    "tokens",
    [{"query_token": ["q" * 20]}, {"admin_token": ["a" * 20]}, {"metrics_token": ["m" * 20]}],
)
def test_metrics_need_a_token_when_tokens_are_configured(make_client, tokens):
    secrets = {key: tuple(SecretStr(t) for t in value) for key, value in tokens.items()}
    with make_client(**secrets) as client:
        r = client.get("/metrics")
        assert_error(r, 401, "unauthorized")
        assert "metrics" in r.json()["error"]["message"]
        token = next(iter(tokens.values()))[0]
        ok = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200 and "shortlist_" in ok.text
        spec = client.get("/openapi.json").json()["paths"]["/metrics"]["get"]
        assert {"MetricsToken": []} in spec["security"]


def test_a_metrics_token_opens_only_metrics(make_client, tools_payload):
    metrics = "m" * 20
    with make_client(
        metrics_token=(SecretStr(metrics),), query_token=(SecretStr("q" * 20),)
    ) as client:
        auth = {"Authorization": f"Bearer {metrics}"}
        assert client.get("/metrics", headers=auth).status_code == 200
        assert client.get("/registries", headers=auth).status_code == 401
        assert client.post("/shortlist", json={"registry": "r", "query": "x"}, headers=auth).status_code == 401


def test_metrics_stay_open_without_tokens(client):
    assert client.get("/metrics").status_code == 200


def _component(client, name: str) -> dict:
    spec = client.get("/openapi.json").json()
    schema = spec["components"]["schemas"][name]
    return {**schema, "components": spec["components"]}  # $refs resolve against the document


def _schema_valid(schema: dict, instance) -> bool:
    import jsonschema  # type: ignore[import-untyped]  # schemathesis brings it, untyped

    return jsonschema.Draft202012Validator(schema).is_valid(instance)


@pytest.mark.parametrize(
    "body",
    [
        {"registry": "demo", "query": "convert 20 euros", "k": 5, "depth_bias": 0.25},
        {"registry": "demo", "query": "convert 20 euros", "k": 3, "policy": "gap"},
        {"registry": "demo", "query": "convert 20 euros", "depth_bias": 0.5, "policy": "fixed"},
        {"registry": "demo", "query": " \t\n\u3000\x1c"},  # blank as str.strip() sees it
        {"registry": "demo", "query": "x" * 300},  # over SHORTLIST_MAX_QUERY_CHARS (200 here)
    ],
)
def test_requests_the_validation_refuses_are_not_schema_valid(make_client, tools_payload, body):
    with make_client(max_query_chars=200) as client:
        client.put("/registries/demo", json=tools_payload)
        assert client.post("/shortlist", json=body).status_code == 422
        assert not _schema_valid(_component(client, "ShortlistRequest"), body)


@pytest.mark.parametrize(
    "body",
    [
        {"registry": "demo", "query": "convert 20 euros", "k": 5, "max_k": 1, "policy": "fixed"},
        {"registry": "demo", "query": "convert 20 euros", "depth_bias": -0.5, "policy": "bor"},
        {"registry": "demo", "query": " x ", "k": None, "depth_bias": 0.25, "policy": None},
    ],
)
def test_schema_valid_requests_are_served(make_client, tools_payload, body):
    with make_client(max_query_chars=200) as client:
        client.put("/registries/demo", json=tools_payload)
        assert _schema_valid(_component(client, "ShortlistRequest"), body)
        assert client.post("/shortlist", json=body).status_code == 200


@pytest.mark.parametrize(
    "payload",
    [
        {"tools": [{"name": "a"}, {"name": "b"}], "equivalents": [[]]},
        {"tools": [{"name": "a"}, {"name": "b"}], "equivalents": [["a"]]},
        [{}],
        [{"description": "no name"}],
        [{"type": "function", "function": {"description": "no name"}}],
        [{"name": ""}],
        [{"name": "a\x01b"}],
    ],
)
def test_tool_uploads_the_validation_refuses_are_not_schema_valid(client, payload):
    from service.schemas_openapi import TOOLS_BODY_OPENAPI

    schema = TOOLS_BODY_OPENAPI["requestBody"]["content"]["application/json"]["schema"]
    assert client.put("/registries/t", json=payload).status_code == 422
    assert not _schema_valid(schema, payload)


def test_the_schema_accepts_every_tool_format(client, tools_payload):
    from service.schemas_openapi import TOOLS_BODY_OPENAPI

    schema = TOOLS_BODY_OPENAPI["requestBody"]["content"]["application/json"]["schema"]
    payload = {"tools": tools_payload, "equivalents": [["get_weather", "send_email"]]}
    assert _schema_valid(schema, tools_payload) and _schema_valid(schema, payload)
    assert client.put("/registries/t", json=payload).status_code == 200


def test_the_schemas_knob_rules_name_real_policies():
    from registry.serving.depth_policies import POLICIES
    from service.schemas_openapi import SHORTLIST_KNOB_RULES

    for rule in SHORTLIST_KNOB_RULES:
        assert set(rule["then"]["properties"]["policy"]["enum"]) - {None} <= set(POLICIES)
