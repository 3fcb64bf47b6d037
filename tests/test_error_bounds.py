"""Validation errors never amplify a request: a 422 lists at most MAX_PROBLEMS problems and
counts the rest, its message spells out five; a /shortlist body is bounded by what a query
can take (413 past it)."""

from __future__ import annotations

import json

from service.errors import MAX_PROBLEMS

JSON = {"content-type": "application/json"}


def test_a_shortlist_body_of_many_unknown_keys_gets_a_small_422(client):
    keys = 60_000
    body = json.dumps({"registry": "x", "query": "q", **{f"k{i}": 0 for i in range(keys)}}).encode()
    r = client.post("/shortlist", content=body, headers=JSON)
    assert r.status_code == 422, r.text[:300]
    assert len(r.content) < 16 * 1024, len(r.content)
    details = r.json()["error"]["details"]
    assert len(details) == MAX_PROBLEMS + 1
    assert details[-1]["omitted"] == keys - MAX_PROBLEMS
    assert f"(and {keys - 5} more)" in r.json()["error"]["message"]


def test_a_shortlist_body_larger_than_any_query_is_413(client, settings):
    body = json.dumps({"registry": "x", "query": "q", "pad": "x" * (6 * settings.max_query_chars + 70_000)})
    r = client.post("/shortlist", content=body.encode(), headers=JSON)
    assert r.status_code == 413 and "SHORTLIST_MAX_QUERY_CHARS" in r.json()["error"]["message"]


def test_an_upload_of_many_bad_tools_gets_a_small_422(client):
    tools = [{"name": f"bad name {i}\x01", "description": 5} for i in range(20_000)]
    body = json.dumps(tools).encode()
    r = client.put("/registries/r", content=body, headers=JSON)
    assert r.status_code == 422
    assert len(r.content) < 32 * 1024, len(r.content)
    error = r.json()["error"]
    assert len(error["details"]) == MAX_PROBLEMS + 1
    assert error["details"][-1]["omitted"] == 40_000 - MAX_PROBLEMS
    assert error["message"].startswith("40000 problems in 20000 tools") and len(error["message"]) < 4000
    assert client.get("/registries/r").status_code == 404
