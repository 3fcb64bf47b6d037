"""Tool names can never address another resource (issue 23, item 1).

A name with a ``.``/``..`` path segment is refused at upload; tool-level routes take the name
in the query string; a registry stored before the rule stays readable and repairable.
"""

from __future__ import annotations

import pytest

from registry.name_checks import url_name_problem
from registry.store.base import RegistryRecord
from registry.store.local import LocalStore
from registry.tools import ToolLimits, parse_tools
from tests.conftest import weather_tools

UNSAFE = [
    "..",
    ".",
    "../../victim",
    "a/../b",
    "a/./b",
    "x/..",
    "%2e%2e/victim",
    ".%2E",
    "..\\victim",
    "a//b",
    "/leading",
    "trailing/",
]


def tool_names(client, registry: str) -> list[str]:
    tools = client.get(f"/registries/{registry}").json()["tools"]
    return [t["function"]["name"] if "function" in t else t["name"] for t in tools]


WEATHER = [t["function"]["name"] if "function" in t else t["name"] for t in weather_tools()]
SAFE = ["fs/read_file", "a.b", "...", ".hidden", "v1.2/get", "%2e%2ex", "a b/c?d#e", "naïve/名"]


@pytest.mark.parametrize("name", UNSAFE)
def test_names_urls_would_resolve_are_refused(name):
    assert url_name_problem(name) is not None


@pytest.mark.parametrize("name", SAFE)
def test_ordinary_names_with_dots_and_slashes_are_kept(name):
    assert url_name_problem(name) is None
    assert [t.name for t in parse_tools([{"name": name}])] == [name]


def test_an_upload_names_every_unsafe_tool_in_one_422(make_client):
    tools = [{"name": "ok_tool"}, *({"name": n} for n in UNSAFE)]
    with make_client() as client:
        r = client.put("/registries/r", json={"tools": tools})
        assert r.status_code == 422, r.text
        details = r.json()["error"]["details"]
        assert sorted(d["tool"] for d in details) == sorted(UNSAFE)
        assert {d["field"] for d in details} == {"name"}
        assert all("segment" in d["message"] for d in details)
        openai = [{"type": "function", "function": {"name": "../../victim"}}]
        r = client.post("/registries/r/tools", json={"tools": openai})
        assert r.status_code == 422 and r.json()["error"]["details"][0]["field"] == "function.name"
        assert client.get("/registries").json()["registries"] == []  # nothing was written


def test_delete_names_the_tool_in_the_query_string(make_client):
    tools = [*weather_tools(), {"name": "a b/c?d#e&f=g"}]
    with make_client() as client:
        client.put("/registries/victim", json=tools).raise_for_status()
        client.put("/registries/r", json=tools).raise_for_status()
        r = client.delete("/registries/r/tools", params={"name": "a b/c?d#e&f=g"})
        assert r.status_code == 204, r.text
        assert client.delete("/registries/r/tools", params={"name": "fs/read_file"}).status_code == 204
        names = tool_names(client, "r")
        assert "fs/read_file" not in names and "a b/c?d#e&f=g" not in names and len(names) == 3
        missing = client.delete("/registries/r/tools", params={"name": "nope"})
        assert missing.status_code == 404 and missing.json()["error"]["details"]["tool"] == "nope"
        assert client.delete("/registries/r/tools").status_code == 422  # no name
        twice = client.delete("/registries/r/tools?name=get_weather&name=send_email")
        assert twice.status_code == 422 and "exactly one" in twice.json()["error"]["message"]
        other = client.delete("/registries/r/tools?name=get_weather&registry=victim")
        assert other.status_code == 422
        assert client.get("/registries/r").json()["version"] == 3  # the refusals wrote nothing
        assert client.get("/registries/victim").json()["version"] == 1


def test_the_path_form_refuses_names_urls_would_resolve(make_client):
    with make_client() as client:
        client.put("/registries/r", json=weather_tools()).raise_for_status()
        # what curl --path-as-is or a raw client sends: the encoded name arrives decoded
        r = client.delete("/registries/r/tools/..%2F..%2Fvictim")
        assert r.status_code == 422, r.text
        assert "tools?name=" in r.json()["error"]["message"]
        assert client.delete("/registries/r/tools/fs/read_file").status_code == 204  # still works
        spec = client.get("/openapi.json").json()["paths"]
        assert spec["/registries/{registry}/tools/{name}"]["delete"]["deprecated"] is True
        assert "delete" in spec["/registries/{registry}/tools"]


@pytest.fixture
def legacy(settings):
    """Registries written before the rule: ``legacy`` holds unsafe names; ``victim`` and
    ``legacy``'s own name are what those names would address in a URL."""
    store = LocalStore(settings.data_dir)
    bad = ["..", "../../victim", "a/../b", "x//y"]
    store.save(RegistryRecord("legacy", 1, [*weather_tools(), *({"name": n, "description": f"tool {n}"} for n in bad)]))
    store.save(RegistryRecord("victim", 1, weather_tools()))
    return bad


def test_a_registry_stored_before_the_rule_stays_readable_and_repairable(make_client, legacy):
    with make_client() as client:
        got = client.get("/registries/legacy")
        assert got.status_code == 200, got.text
        assert tool_names(client, "legacy")[-4:] == legacy
        r = client.post("/shortlist", json={"registry": "legacy", "query": "weather in Paris"})
        assert r.status_code == 200
        # other writes keep working: an upsert validates the new tools only
        r = client.post("/registries/legacy/tools", json=[{"name": "new_tool"}])
        assert r.status_code == 200 and r.json()["tools"] == 9
        # the admin repairs it: each bad tool is deleted by name, nothing else is touched
        for version, name in enumerate(legacy, start=3):
            r = client.delete("/registries/legacy/tools", params={"name": name})
            assert r.status_code == 204, (name, r.text)
            assert client.get("/registries/legacy").json()["version"] == version
        assert client.get("/registries/victim").json()["tools"] == weather_tools()
        assert tool_names(client, "legacy") == [*WEATHER, "new_tool"]
        # a PUT that still carries one is refused, naming it
        r = client.put("/registries/legacy", json=[*weather_tools(), {"name": ".."}])
        assert r.status_code == 422 and r.json()["error"]["details"][0]["tool"] == ".."


def test_a_replica_catching_up_reads_the_stored_names(engine, settings):
    LocalStore(settings.data_dir).save(RegistryRecord("legacy", 1, [{"name": "../x"}, {"name": "ok"}]))
    assert engine.writer.load_all() == 1
    assert [t.name for t in engine.snapshots.snapshot("legacy").tools] == ["../x", "ok"]
    LocalStore(settings.data_dir).save(RegistryRecord("legacy", 2, [{"name": "../x"}, {"name": "ok2"}]))
    engine.writer.refresh()
    assert [t.name for t in engine.snapshots.snapshot("legacy").tools] == ["../x", "ok2"]
    assert ToolLimits().for_stored().url_safe_names is False and ToolLimits().url_safe_names


HIDDEN = ["\u202egnp.exe", "a\u200bb", "rtl\u202b", "iso\u2066late\u2069", "bom\ufeff", "zwj\u200d", "lrm\u200e"]


def test_names_with_bidi_or_zero_width_characters_are_refused_with_one_clear_422(make_client):
    tools = [{"name": "ok_tool"}, *({"name": n} for n in HIDDEN)]
    with make_client() as client:
        r = client.put("/registries/r", json={"tools": tools})
        assert r.status_code == 422, r.text
        details = r.json()["error"]["details"]
        assert sorted(d["tool"] for d in details) == sorted(HIDDEN)
        first = next(d for d in details if d["tool"] == HIDDEN[0])
        assert "U+202E (RIGHT-TO-LEFT OVERRIDE)" in first["message"]
        assert "display" in first["message"]
        assert client.get("/registries/r").status_code == 404  # nothing written


def test_a_stored_name_with_a_bidi_character_stays_readable(tmp_path):
    definitions = [{"name": HIDDEN[0], "description": "old"}]
    assert [t.name for t in parse_tools(definitions, ToolLimits().for_stored())] == [HIDDEN[0]]
