"""Client retry policy, token choice and error parsing, on httpx's MockTransport (no server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from tool_shortlist_client import (
    APIError,
    AsyncShortlistClient,
    ServerError,
    ServiceUnavailableError,
    ShortlistClient,
    TransportError,
)
from tool_shortlist_client.models import Shortlist

URL = "http://shortlist.test"
SHORTLIST = {
    "shortlist_id": "abc", "registry": "demo", "version": 1, "policy": "bor", "scorer": "hybrid",
    "k": 1, "n_tools": 4, "p_rand": 0.25, "bor_max_bits": 2.0, "depth_bias": 0.0,
    "tools": [{"name": "get_weather", "rank": 1, "score": 0.7, "definition": {"name": "get_weather"}}],
}  # fmt: skip
UNHEALTHY = {"error": {"type": "unhealthy", "message": "not ready: loading", "details": None}}


def scripted(
    *steps: httpx.Response | type[httpx.TransportError],
) -> tuple[list[httpx.Request], Callable]:
    """A handler playing ``steps`` in order (a response, or an httpx error class to raise)."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        step = steps[min(len(seen), len(steps)) - 1]
        if isinstance(step, type):
            raise step("scripted", request=request)
        return step

    return seen, handler


def client_for(handler: Callable, **options) -> ShortlistClient:
    http = httpx.Client(transport=httpx.MockTransport(handler))
    options = {"retries": 3, "backoff": 0.001, "registry": "demo", **options}
    return ShortlistClient(URL, http_client=http, **options)


def test_503_is_retried_then_succeeds():
    seen, handler = scripted(
        httpx.Response(503, json=UNHEALTHY), httpx.Response(503, json=UNHEALTHY, headers={"Retry-After": "0"}),
        httpx.Response(200, json=SHORTLIST),
    )  # fmt: skip
    shortlist = client_for(handler).shortlist("weather")
    assert shortlist.names == ["get_weather"] and len(seen) == 3


def test_503_exhausted_raises_with_the_service_error():
    seen, handler = scripted(httpx.Response(503, json=UNHEALTHY))
    with pytest.raises(ServiceUnavailableError) as err:
        client_for(handler, retries=2).shortlist("weather")
    assert len(seen) == 3
    assert (err.value.status_code, err.value.error_type) == (503, "unhealthy")
    assert err.value.message == "not ready: loading"


def test_4xx_is_not_retried():
    body = {"error": {"type": "validation", "message": "bad", "details": [{"field": "k"}]}}
    seen, handler = scripted(httpx.Response(422, json=body))
    with pytest.raises(APIError) as err:
        client_for(handler).shortlist("weather")
    assert len(seen) == 1 and err.value.details == [{"field": "k"}]


def test_connection_errors_retried_always_other_transport_errors_only_when_idempotent():
    written = {"registry": "r", "version": 1, "tools": 1}
    seen, handler = scripted(httpx.ConnectError, httpx.Response(200, json=written))
    assert client_for(handler).upsert_tools("r", [{"name": "t"}]).version == 1
    assert len(seen) == 2  # never sent: safe to resend even a non-idempotent write

    seen, handler = scripted(httpx.ReadError, httpx.Response(200, json=written))
    with pytest.raises(TransportError):
        client_for(handler).upsert_tools("r", [{"name": "t"}])
    assert len(seen) == 1  # may have been applied: not resent

    seen, handler = scripted(
        httpx.ReadTimeout, httpx.ReadError, httpx.Response(200, json=SHORTLIST)
    )
    assert client_for(handler).shortlist("weather").k == 1
    assert len(seen) == 3


def test_non_json_errors_and_unknown_fields():
    _, handler = scripted(httpx.Response(502, text="<html>bad gateway</html>"))
    with pytest.raises(ServerError) as err:
        client_for(handler).list_registries()
    assert err.value.error_type == "http" and "bad gateway" in err.value.message

    newer = {**SHORTLIST, "added_later": {"x": 1}}
    newer["tools"] = [{**SHORTLIST["tools"][0], "added_later": True}]
    assert Shortlist.model_validate(newer).tools[0].name == "get_weather"


def test_tokens_and_bodies_per_route(tmp_path):
    seen, handler = scripted(httpx.Response(200, json={"registry": "r", "version": 1, "tools": 1}))
    client = client_for(handler, token="q-token", admin_token="a-token")
    path = tmp_path / "tools.json"
    path.write_text(json.dumps({"tools": [{"name": "t"}], "equivalents": [["t", "u"]]}))
    client.put_registry("r", path)
    assert seen[-1].headers["authorization"] == "Bearer a-token"
    assert json.loads(seen[-1].content) == {"tools": [{"name": "t"}], "equivalents": [["t", "u"]]}
    assert seen[-1].headers["content-type"] == "application/json"

    seen2, handler2 = scripted(httpx.Response(200, json=SHORTLIST))
    client2 = client_for(handler2, token="q-token", admin_token="a-token")
    client2.shortlist("weather", depth_bias=0.5, allow_empty=True)
    sent = seen2[-1]
    assert sent.headers["authorization"] == "Bearer q-token" and sent.url.path == "/shortlist"
    assert json.loads(sent.content) == {
        "registry": "demo", "query": "weather", "depth_bias": 0.5, "allow_empty": True,
    }  # fmt: skip

    seen3, handler3 = scripted(httpx.Response(204))
    client_for(handler3, admin_token="a-token").delete_tool("r", "fs/read file")
    assert seen3[-1].url.path == "/registries/r/tools"  # the name is in the query, never the path
    assert seen3[-1].url.params["name"] == "fs/read file"
    client_for(handler3, admin_token="a-token").delete_tool("r", "../../victim")
    assert (seen3[-1].method, seen3[-1].url.path) == ("DELETE", "/registries/r/tools")
    assert seen3[-1].url.params["name"] == "../../victim"


def test_async_client_retries_503():
    seen, handler = scripted(
        httpx.Response(503, json=UNHEALTHY), httpx.Response(200, json=SHORTLIST)
    )

    async def run() -> Shortlist:
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        async with AsyncShortlistClient(URL, http_client=http, backoff=0.001) as client:
            return await client.shortlist("weather", registry="demo")

    assert asyncio.run(run()).names == ["get_weather"] and len(seen) == 2

    seen, handler = scripted(httpx.Response(503, json=UNHEALTHY))

    async def exhausted() -> None:
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        async with AsyncShortlistClient(URL, http_client=http, retries=1, backoff=0.001) as client:
            await client.shortlist("weather", registry="demo")

    with pytest.raises(ServiceUnavailableError):
        asyncio.run(exhausted())
    assert len(seen) == 2


def test_the_client_distribution_needs_only_httpx_and_pydantic():
    import subprocess
    import sys
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "client" / "pyproject.toml").read_text())["project"]
    assert sorted(dep.split(">")[0] for dep in project["dependencies"]) == ["httpx", "pydantic"]
    code = (
        "import sys, tool_shortlist_client;"
        "heavy = ('onnxruntime', 'faiss', 'torch', 'numpy', 'registry', 'service', 'fastapi');"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=root / "client",
    )
    assert out.stdout.strip() == "[]"


def test_ready_and_wait_ready():
    _, down = scripted(httpx.ConnectError)
    client = client_for(down)
    assert not client.ready()
    with pytest.raises(TransportError):
        client.wait_ready(timeout=0.05, interval=0.01)
    seen, loading = scripted(httpx.Response(503, json=UNHEALTHY), httpx.Response(200, json={}))
    client_for(loading).wait_ready(timeout=5, interval=0.001)
    assert [r.url.path for r in seen] == ["/readyz", "/readyz"]
