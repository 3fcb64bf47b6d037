"""The Python client over a real server: deleting a tool never deletes anything else, whatever
its name (issue 23, item 1). ``legacy`` was stored before names like ``../../victim`` were
refused at upload; before the fix, ``delete_tool("legacy", "../../victim")`` sent
``DELETE /registries/victim`` and deleted that registry."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from registry.store.base import RegistryRecord
from registry.store.local import LocalStore
from tests.conftest import weather_tools
from tool_shortlist_client import AsyncShortlistClient, InvalidRequestError, ShortlistClient

pytestmark = pytest.mark.e2e

ADMIN = "names-admin-token-0123456789"
BAD = ["../../victim", "..", "../legacy2/tools/get_weather", "a/../../victim2", "%2e%2e"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path):
    from tests.server import Servers

    base = tmp_path_factory.mktemp("names")
    store = LocalStore(base / "data")
    tools = [*weather_tools(), *({"name": n, "description": f"legacy tool {n}"} for n in BAD)]
    for name in ("legacy", "legacy2"):
        store.save(RegistryRecord(name, 1, tools))
    for name in ("victim", "victim2"):
        store.save(RegistryRecord(name, 1, weather_tools()))
    started = Servers(base, minilm_cache)
    try:
        yield started.start(admin_token=ADMIN)
    finally:
        started.close()


def versions(client: ShortlistClient) -> dict[str, int]:
    return {r.registry: r.version for r in client.list_registries()}


def test_the_client_deletes_exactly_the_named_tool(server):
    with ShortlistClient(server.url, admin_token=ADMIN) as admin:
        before = versions(admin)
        assert set(before) == {"legacy", "legacy2", "victim", "victim2"}
        for i, name in enumerate(BAD, start=1):
            admin.delete_tool("legacy", name)
            after = versions(admin)
            assert after == {**before, "legacy": 1 + i}, name  # only legacy moved, one version
        names = [t.get("name") or t["function"]["name"] for t in admin.get_registry("legacy").tools]
        assert not set(BAD) & set(names) and len(names) == len(weather_tools())
        assert len(admin.get_registry("legacy2").tools) == len(weather_tools()) + len(BAD)


def test_the_async_client_too(server):
    async def run() -> dict[str, int]:
        async with AsyncShortlistClient(server.url, admin_token=ADMIN) as admin:
            await admin.delete_tool("legacy2", "../../victim")
            return {r.registry: r.version for r in await admin.list_registries()}

    got = asyncio.run(run())
    assert got["legacy2"] == 2 and got["victim"] == 1 and got["victim2"] == 1


def test_uploads_of_such_names_are_refused_and_paths_cannot_be_resolved(server):
    with ShortlistClient(server.url, admin_token=ADMIN) as admin:
        with pytest.raises(InvalidRequestError) as err:
            admin.put_registry("fresh", [{"name": "../../victim"}, {"name": "fine"}])
        assert err.value.status_code == 422 and "../../victim" in str(err.value)
        for registry in ("..", ".", ""):
            with pytest.raises(ValueError):
                admin.delete_registry(registry)  # would be DELETE /registries/.. -> /
        assert "victim" in versions(admin) and "fresh" not in versions(admin)
    # a raw request with the name in the path form is refused, not resolved
    r = httpx.delete(f"{server.url}/registries/victim/tools/a%2F..%2Fb",
                     headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 422 and "tools?name=" in r.json()["error"]["message"]
