"""Limits and validation at the HTTP edge: each breach gets a clear 413/415/422, never a 500,
and no name ever reaches the filesystem outside the data directory."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, get_args
from urllib.parse import unquote

import pytest

from registry.errors import InvalidRegistryName
from registry.feedback import MAX_CALLS
from registry.index.hybrid import SCORERS
from registry.request import MAX_K
from registry.serving.depth_policies import POLICIES
from registry.store.base import RegistryRecord
from registry.store.local import LocalStore
from registry.tools import MAX_JSON_DEPTH
from service.schemas import MAX_USED_TOOLS, PolicyName, ScorerName

BODY_ROUTES = [
    ("POST", "/shortlist"),
    ("POST", "/feedback"),
    ("PUT", "/registries/r"),
    ("POST", "/registries/r/tools"),
]


def error_of(response: Any, status: int, error_type: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "details"}
    assert body["error"]["type"] == error_type, body
    return body["error"]


def nested(depth: int) -> dict[str, Any]:
    """A tool whose JSON nests ``depth`` objects (the tool itself is level 1)."""
    schema: dict[str, Any] = {}
    inner = schema
    for _ in range(depth - 2):  # tool (1) -> parameters (2) -> x (3) -> ...
        inner["x"] = {}
        inner = inner["x"]
    return {"name": "deep", "parameters": schema}


# -- sizes ------------------------------------------------------------------------------------


def test_streamed_body_over_the_limit_is_413_without_content_length(make_client):
    with make_client(max_body_bytes=4096) as client:
        chunks = iter([b'[{"name": "a", "description": "' + b"x" * 3000, b"y" * 3000 + b'"}]'])
        r = client.put(
            "/registries/r", content=chunks, headers={"content-type": "application/json"}
        )
        error = error_of(r, 413, "payload_too_large")
        assert "SHORTLIST_MAX_BODY_BYTES" in error["message"]
        error_of(client.get("/registries/r"), 404, "not_found")


def test_upsert_past_the_tool_limit_is_413_and_keeps_the_registry(make_client, tools_payload):
    with make_client(max_tools_per_registry=5) as client:
        assert client.put("/registries/r", json=tools_payload).status_code == 200
        extra = [{"name": f"new_{i}"} for i in range(2)]
        error = error_of(client.post("/registries/r/tools", json=extra), 413, "payload_too_large")
        assert error["details"] == {"tools": 6, "limit": 5}
        assert client.get("/registries/r").json()["version"] == 1


def test_description_and_tool_size_limits_are_422(make_client):
    with make_client(max_description_chars=100, max_tool_bytes=1024) as client:
        long_description = [{"name": "a", "description": "d" * 101}]
        error = error_of(client.put("/registries/r", json=long_description), 422, "validation")
        assert "at most 100 characters" in error["message"]
        big_schema = [{"name": "b", "parameters": {"type": "object", "description": "s" * 2000}}]
        error = error_of(client.put("/registries/r", json=big_schema), 422, "validation")
        assert "more than the limit of 1024 bytes" in error["message"]


def test_query_length_and_blank_queries_are_422(make_client, tools_payload):
    with make_client(max_query_chars=50) as client:
        client.put("/registries/r", json=tools_payload)
        error = error_of(
            client.post("/shortlist", json={"registry": "r", "query": "q" * 51}), 422, "validation"
        )
        assert "the limit is 50" in error["message"]
        for blank in ("", "   \n\t"):
            r = client.post("/shortlist", json={"registry": "r", "query": blank})
            error_of(r, 422, "validation")
        assert (
            client.post("/shortlist", json={"registry": "r", "query": "q" * 50}).status_code == 200
        )


@pytest.mark.parametrize(
    "field, value",
    [
        ("k", 0),
        ("k", MAX_K + 1),
        ("max_k", 0),
        ("max_k", MAX_K + 1),
        ("k", -5),
        ("max_k", 1.5),
        ("scorer", "nope"),
        ("policy", "random"),
    ],
)
def test_depth_and_choice_bounds_are_422(client, tools_payload, field, value):
    client.put("/registries/r", json=tools_payload)
    body = {"registry": "r", "query": "weather", field: value}
    error = error_of(client.post("/shortlist", json=body), 422, "validation")
    assert error["details"][0]["field"] == field


def test_documented_choices_are_the_engines():
    assert get_args(PolicyName) == POLICIES
    assert set(get_args(ScorerName)) == set(SCORERS)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"shortlist_id": "x" * 129, "used": ["a"]}, "shortlist_id"),
        ({"shortlist_id": "", "used": ["a"]}, "shortlist_id"),
        ({"shortlist_id": "abc", "used": []}, "used"),
        ({"shortlist_id": "abc", "used": ["a"] * (MAX_USED_TOOLS + 1)}, "used"),
        ({"shortlist_id": "abc", "used": ["t" * 257]}, "used.0"),
        ({"shortlist_id": "abc", "used": [""]}, "used.0"),
        (
            {"shortlist_id": "abc", "used": ["a"], "calls": [{"tool": "t" * 257, "useful": True}]},
            "calls.0.tool",
        ),
    ],
)
def test_feedback_list_and_string_limits_are_422(client, body, field):
    error = error_of(client.post("/feedback", json=body), 422, "validation")
    assert error["details"][0]["field"] == field


def test_feedback_with_too_many_calls_is_422_when_the_body_fits(make_client):
    body = {"shortlist_id": "abc", "used": ["a"], "calls": [{"tool": "a", "useful": True}] * (MAX_CALLS + 1)}
    with make_client() as client:  # ~270 KB: past SHORTLIST_MAX_FEEDBACK_BODY_BYTES first
        error_of(client.post("/feedback", json=body), 413, "payload_too_large")
    with make_client(max_feedback_body_bytes=1 << 20) as client:
        error = error_of(client.post("/feedback", json=body), 422, "validation")
        assert error["details"][0]["field"] == "calls"


def test_tool_name_in_the_path_is_at_most_256_chars(client, tools_payload):
    client.put("/registries/r", json=tools_payload)
    error = error_of(client.delete("/registries/r/tools/" + "t" * 257), 422, "validation")
    assert error["details"][0]["field"] == "path.name"
    error_of(client.delete("/registries/r/tools/" + "t" * 256), 404, "not_found")
    assert client.delete("/registries/r/tools/fs/read_file").status_code == 204  # slashes are fine


@pytest.mark.parametrize("route", ["/registries/{}", "/registries/{}/tools"])
@pytest.mark.parametrize("name", ["a b", "é", "a" * 129, ".hidden", "a%5Cb"])
def test_bad_registry_names_in_paths_are_422(client, tools_payload, route, name):
    method = "PUT" if route.endswith("{}") else "POST"
    error = error_of(
        client.request(method, route.format(name), json=tools_payload), 422, "validation"
    )
    assert "registry name" in error["message"]
    error_of(client.get(f"/registries/{name}"), 422, "validation")


def test_bad_registry_name_in_a_shortlist_body_is_422(client):
    r = client.post("/shortlist", json={"registry": "../etc", "query": "q"})
    assert error_of(r, 422, "validation")["details"][0]["field"] == "registry"


def test_long_field_names_are_not_echoed_in_full(client):
    r = client.post("/shortlist", json={"registry": "r", "query": "q", "k" * 100_000: 1})
    error = error_of(r, 422, "validation")
    assert len(r.content) < 2000 and len(error["details"][0]["field"]) <= 200


# -- nesting, encoding and content type --------------------------------------------------------


@pytest.mark.parametrize("method, path", BODY_ROUTES)
def test_absurdly_nested_bodies_are_422_not_500(client, method, path):
    deep = b"[" * 60_000 + b"]" * 60_000  # within even the feedback body limit (128 KiB)
    r = client.request(method, path, content=deep, headers={"content-type": "application/json"})
    error = error_of(r, 422, "validation")
    assert "nested too deeply" in error["message"]


def test_nesting_depth_of_a_tool_definition_is_limited(client):
    error = error_of(
        client.put("/registries/r", json=[nested(MAX_JSON_DEPTH + 1)]), 422, "validation"
    )
    assert f"nested more than {MAX_JSON_DEPTH} levels" in error["message"]
    error_of(client.get("/registries/r"), 404, "not_found")  # nothing stored
    # At the limit the tool is stored, read back and served (no serialiser gives up on it).
    assert client.put("/registries/r", json=[nested(MAX_JSON_DEPTH)]).status_code == 200
    assert client.get("/registries/r").json()["tools"] == [nested(MAX_JSON_DEPTH)]
    r = client.post("/shortlist", json={"registry": "r", "query": "deep", "k": 1})
    assert r.status_code == 200 and r.json()["tools"][0]["definition"] == nested(MAX_JSON_DEPTH)


@pytest.mark.parametrize("method, path", BODY_ROUTES)
@pytest.mark.parametrize("raw", [b'{"registry": "r", "query": "\xff\xfe"}', b"\xc3\x28", b"{bad"])
def test_undecodable_bodies_are_422(client, method, path, raw):
    r = client.request(method, path, content=raw, headers={"content-type": "application/json"})
    error = error_of(r, 422, "validation")
    assert error["details"][0]["field"].startswith("body"), error


@pytest.mark.parametrize("method, path", BODY_ROUTES)
@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_non_json_content_types_are_415(client, method, path, content_type):
    r = client.request(method, path, content=b"[]", headers={"content-type": content_type})
    error = error_of(r, 415, "unsupported_media_type")
    assert "application/json" in error["message"]


@pytest.mark.parametrize("method, path", BODY_ROUTES)
def test_a_body_without_content_type_is_415(client, method, path):
    # A browser may send such a body cross-site without a CORS preflight; JSON needs one.
    r = client.request(method, path, content=b'{"registry": "r", "query": "q"}')
    error = error_of(r, 415, "unsupported_media_type")
    assert "missing" in error["message"]


def test_json_content_types_are_accepted(client, tools_payload):
    raw = json.dumps(tools_payload).encode()
    for content_type in ("application/json; charset=utf-8", "application/vnd.tools+json"):
        r = client.put("/registries/r", content=raw, headers={"content-type": content_type})
        assert r.status_code == 200
        r = client.post(
            "/shortlist",
            content=b'{"registry": "r", "query": "mail"}',
            headers={"content-type": content_type},
        )
        assert r.status_code == 200


# -- path traversal ------------------------------------------------------------------------------

TRAVERSAL_SEGMENTS = [
    "..",
    ".",
    "%2e%2e",
    "%2E%2E",
    ".%2e",
    "%2e",
    "a/../b",
    "a%2F..%2Fb",
    "..%2Foutside",
    "%2e%2e%2f%2e%2e%2foutside",
    "..%5Coutside",
    "..\\outside",
    "%252e%252e",
    "%00",
    "a%00b",
    "%2Ftmp%2Foutside",
    "~",
    ".deleted-x",
    ".tmp-x",
    # Unicode look-alikes of '.' and '/', percent-encoded as UTF-8.
    "%EF%BC%8E%EF%BC%8E",  # fullwidth full stops
    "%E2%80%A5",  # two dot leader
    "%E2%80%A4%E2%80%A4",  # one dot leaders
    "%E3%80%82%E3%80%82",  # ideographic full stops
    "..%E2%88%95outside",  # division slash
    "..%EF%BC%8Foutside",  # fullwidth solidus
]


def raw_request(app: Any, method: str, raw_path: str, body: bytes) -> int:
    """Send a path exactly as written (HTTP clients would normalise the dot segments away).

    The scope is what uvicorn builds: ``path`` percent-decoded, ``raw_path`` untouched.
    """
    sent: dict[str, Any] = {}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            sent["status"] = message["status"]

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode("latin-1"),
        "root_path": "",
        "query_string": b"",
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    asyncio.run(app(scope, receive, send))
    return int(sent["status"])


def tree(root: Path, skip: Path) -> dict[str, tuple[int, int]]:
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            continue
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path == skip:
                continue
            stat = path.lstat()
            found[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return found


def test_no_name_reaches_outside_the_data_dir(make_client, tmp_path, tools_payload, settings):
    # data_dir is tmp_path/data; plant files around and above it that a traversal would hit.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.json").write_text("{}")
    (tmp_path / "registries").mkdir()
    before = tree(tmp_path, skip=settings.data_dir)
    body = json.dumps(tools_payload).encode()

    with make_client() as client:
        app = client.app
        for segment in TRAVERSAL_SEGMENTS:
            for method, template, payload in [
                ("PUT", "/registries/{}", body),
                ("POST", "/registries/{}/tools", body),
                ("GET", "/registries/{}", b""),
                ("GET", "/registries/{}/report", b""),
                ("DELETE", "/registries/{}", b""),
                ("DELETE", "/registries/{}/tools/x", b""),
                ("DELETE", "/registries/ok/tools/{}", b""),
            ]:
                status = raw_request(app, method, template.format(segment), payload)
                assert status in (404, 405, 422), (method, template, segment, status)
            name = unquote(segment)
            r = client.post("/shortlist", json={"registry": name, "query": "q"})
            assert r.status_code in (404, 422), (segment, r.status_code)

    assert tree(tmp_path, skip=settings.data_dir) == before  # nothing outside was touched
    registries = settings.data_dir / "registries"
    assert sorted(p.name for p in registries.iterdir()) == []  # and nothing odd inside

    store = LocalStore(settings.data_dir)  # the store checks names itself, whatever the caller did
    for name in ("..", ".", "../outside", "a/b", "/tmp/outside", ".deleted-x", "\u2025", ""):
        with pytest.raises(InvalidRegistryName):
            store.save(RegistryRecord(name, 1, []))
        with pytest.raises(InvalidRegistryName):
            store.load(name)
        with pytest.raises(InvalidRegistryName):
            store.delete(name)
    assert tree(tmp_path, skip=settings.data_dir) == before


def test_the_store_ignores_directories_no_client_could_have_made(tmp_path):
    store = LocalStore(tmp_path)
    store.save(RegistryRecord("good", 1, [{"name": "a"}]))
    record = (tmp_path / "registries" / "good" / "v00000001.json").read_bytes()
    for odd in ("bad name", "é", ".hidden", "-ok"):
        (tmp_path / "registries" / odd).mkdir()
        (tmp_path / "registries" / odd / "v00000001.json").write_bytes(record)
    # Listed names are loadable names: one odd directory must not stop a start-up.
    assert store.list_registries() == ["-ok", "good"]
    assert all(store.load(name) is not None for name in store.list_registries())
