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
