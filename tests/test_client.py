"""The Python client (client/, `tool-shortlist-client`) against a real server with the real model:
uploads, shortlists, feedback, the report, errors as typed exceptions, tokens, 503 retries."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from tests.conftest import weather_tools
from tool_shortlist_client import (
    AsyncShortlistClient,
    InvalidRequestError,
    NotFoundError,
    Shortlist,
    ShortlistClient,
    ToolCall,
    UnauthorizedError,
)

pytestmark = pytest.mark.e2e

ADMIN = "client-admin-token-0123456789"
QUERY = "client-query-token-0123456789"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path):
    from tests.server import Servers

    started = Servers(tmp_path_factory.mktemp("client"), minilm_cache)
    yield started
    started.close()


@pytest.fixture(scope="module")
def server(servers):
    return servers.start(admin_token=ADMIN, query_token=QUERY)


@pytest.fixture
def client(server):
    with ShortlistClient(server.url, token=QUERY, admin_token=ADMIN, registry="weather") as c:
        yield c


@pytest.fixture(scope="module")
def uploaded(server, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Registry ``weather`` uploaded from a JSON file through the client."""
    path = tmp_path_factory.mktemp("tools") / "tools.json"
    path.write_text(json.dumps(weather_tools()))
    with ShortlistClient(server.url, admin_token=ADMIN) as admin:
        info = admin.upload_registry("weather", path)
    assert (info.registry, info.tools) == ("weather", 4)
    return "weather"


def test_upload_shortlist_feedback_and_report(client, uploaded):
    shortlist = client.shortlist("what's the weather in Paris tomorrow?")
    assert isinstance(shortlist, Shortlist)
    assert shortlist.registry == "weather" and shortlist.n_tools == 4
    assert shortlist.names[0] == "get_weather"
    assert shortlist.k == len(shortlist.tools) >= 1
    assert shortlist.tools[0].definition["name"] == "get_weather"  # as uploaded
    assert shortlist.tools[0].rank == 1 and shortlist.policy == "bor"

    result = client.feedback(
        shortlist, ["get_weather"], success=True,
        calls=[("get_weather", True), {"tool": "send_email", "useful": False}],
    )  # fmt: skip
    assert result.shortlist_id == shortlist.shortlist_id and not result.duplicate
    assert result.presented.exact and 0 < result.p_rand.exact <= 1
    again = client.feedback(
        shortlist.shortlist_id, ["get_weather"], calls=[ToolCall(tool="get_weather", useful=True)]
    )
    assert again.duplicate

    report = client.report("weather")
    assert report.events == 1
    usage = {tool.name: tool for tool in report.tools}
    assert usage["get_weather"].useful_calls == 1 and usage["send_email"].useless_calls == 1
    assert usage["get_weather"].used == 1


def test_shortlist_fields_of_real_workloads(client, uploaded):
    named = client.shortlist("call convert_currency for 20 EUR in USD")
    assert named.tools[0].name == "convert_currency" and named.tools[0].named
    several = client.shortlist(
        "read the file notes.md from disk, then send an email to bob with its contents"
    )
    assert all(isinstance(intent, str) for intent in several.intents)
    assert {"fs/read_file", "send_email"} <= set(several.names)
    empty_ok = client.shortlist("xyzzy plugh frobnicate", allow_empty=True, max_k=3)
    assert empty_ok.confidence is not None and 0.0 <= empty_ok.confidence <= 1.0
    assert empty_ok.k == len(empty_ok.tools) <= 3
    fixed = client.shortlist("weather", k=3, scorer="bm25")
    assert (fixed.k, fixed.policy, fixed.scorer) == (3, "fixed", "bm25")
    assert fixed.policy_version == "fixed" and fixed.explain is None


def test_explain_and_policy_version(client, uploaded):
    explained = client.shortlist("what's the weather in Paris tomorrow?", explain=True)
    assert explained.policy_version == "default"
    assert explained.explain is not None
    assert explained.explain.chosen >= 1 and explained.explain.shown >= explained.explain.chosen
    assert len(explained.explain.margins) >= explained.explain.chosen
    plain = client.shortlist("what's the weather in Paris tomorrow?")
    assert plain.explain is None and plain.policy_version == "default"


def test_registry_admin_helpers(client, server):
    with ShortlistClient(server.url, admin_token=ADMIN) as admin:
        info = admin.put_registry(
            "scratch",
            {"tools": weather_tools()[:2]},
        )
        assert (info.version, info.tools) == (1, 2)
        info = admin.upsert_tools(
            "scratch", weather_tools()[2:], equivalents=[["get_weather", "convert_currency"]]
        )
        assert (info.version, info.tools) == (2, 4)
        registry = admin.get_registry("scratch")
        assert [sorted(group) for group in registry.equivalents] == [
            ["convert_currency", "get_weather"]
        ]
        assert [t.get("name") or t["function"]["name"] for t in registry.tools][:2] == [
            "get_weather",
            "send_email",
        ]
        admin.delete_tool("scratch", "fs/read_file")  # a name with a slash
        assert admin.get_registry("scratch").version == 3
        assert "scratch" in {r.registry for r in admin.list_registries()}
        admin.delete_registry("scratch")
        with pytest.raises(NotFoundError) as err:
            admin.get_registry("scratch")
        assert err.value.error_type == "not_found" and err.value.status_code == 404


def test_errors_are_exceptions_carrying_the_service_error(client, server, uploaded):
    with pytest.raises(NotFoundError) as err:
        client.shortlist("weather", registry="no-such-registry")
    assert (err.value.status_code, err.value.type) == (404, "not_found")
    assert "no-such-registry" in err.value.message

    with pytest.raises(InvalidRequestError) as err:
        client.shortlist("weather", k=0)
    assert err.value.error_type == "validation"
    assert [d["field"] for d in err.value.details] == ["k"]

    with pytest.raises(InvalidRequestError) as err:
        client.shortlist("weather", k=3, depth_bias=0.5)
    assert err.value.error_type == "validation"

    with pytest.raises(NotFoundError):
        client.feedback("0" * 32, ["get_weather"])
    shortlist = client.shortlist("send an email to alice")
    with pytest.raises(InvalidRequestError) as err:
        client.feedback(shortlist, ["no_such_tool"])
    assert "no_such_tool" in json.dumps(err.value.details)

    with (
        ShortlistClient(server.url, registry="weather") as anonymous,
        pytest.raises(UnauthorizedError) as err,
    ):
        anonymous.shortlist("weather")
    assert err.value.error_type == "unauthorized"
    assert err.value.details["reason"] == "missing_token"
    assert err.value.headers["www-authenticate"].startswith("Bearer")
    query_only = ShortlistClient(server.url, token=QUERY)
    with query_only, pytest.raises(UnauthorizedError) as err:
        query_only.put_registry("weather", weather_tools())  # a query token cannot write
    assert err.value.details["reason"] == "invalid_token"

    with pytest.raises(ValueError):
        client.put_registry("weather", {"not_tools": []})


def test_async_client(server, uploaded):
    async def run() -> None:
        async with AsyncShortlistClient(
            server.url, token=QUERY, admin_token=ADMIN, registry="weather"
        ) as client:
            await client.wait_ready(timeout=5)
            lists = await asyncio.gather(
                client.shortlist("convert 20 euros to yen"),
                client.shortlist("read the file at /etc/hosts"),
            )
            assert [s.names[0] for s in lists] == ["convert_currency", "fs/read_file"]
            result = await client.feedback(lists[0], ["convert_currency"], success=True)
            assert result.presented.exact
            assert "weather" in {r.registry for r in await client.list_registries()}
            assert (await client.get_registry("weather")).registry == "weather"
            assert (await client.efficiency_report("weather")).registry == "weather"
            info = await client.upsert_tools("async-scratch", weather_tools()[:1])
            assert info.tools == 1
            await client.delete_tool("async-scratch", "get_weather")
            await client.delete_registry("async-scratch")
            with pytest.raises(NotFoundError) as err:
                await client.shortlist("weather", registry="async-scratch")
            assert err.value.error_type == "not_found"

    asyncio.run(run())


def test_retries_503_while_a_server_is_still_loading(servers, uploaded):
    """A second server on the same data dir, queried at once: refused connections, then 503
    (`unhealthy`) while the model loads, are retried until the shortlist comes."""
    statuses: list[int] = []
    http = httpx.Client(event_hooks={"response": [lambda r: statuses.append(r.status_code)]})
    loading = servers.start(wait=False, admin_token=ADMIN, query_token=QUERY)
    with ShortlistClient(
        loading.url, token=QUERY, registry="weather", retries=400, backoff=0.02,
        max_backoff=0.05, http_client=http,
    ) as client:  # fmt: skip
        shortlist = client.shortlist("what's the weather in Paris tomorrow?")
    http.close()
    assert shortlist.names[0] == "get_weather"
    assert statuses[-1] == 200 and 503 in statuses
    assert set(statuses[:-1]) == {503}
