"""Shared fixtures. Nothing here reads ../shared: tests carry their own small data."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Exploration (SHORTLIST_EXPLORE_SHARE, 5% by default) serves random extra depth; tests compare
# exact lists and replicas, so it is off unless a test turns it on (tests/test_policies.py does).
os.environ.setdefault("SHORTLIST_EXPLORE_SHARE", "0")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


class CountingEmbedder:
    """Wraps an embedder and counts the documents it embeds (to test the embedding cache)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.documents = 0

    def embed_query(self, text: str) -> np.ndarray:
        return self.inner.embed_query(text)

    def embed_documents(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        self.documents += len(texts)
        return self.inner.embed_documents(texts, batch_size)


@pytest.fixture
def hashing_embedder():
    from registry.index.embed import HashingEmbedder

    return CountingEmbedder(HashingEmbedder())


@pytest.fixture(scope="session")
def bor_policy():
    from tests.cores import shipped_policy

    return shipped_policy()


@pytest.fixture
def settings(tmp_path: Path):
    from tests.cores import settings_for

    return settings_for(tmp_path / "data")


@pytest.fixture
def make_client(settings, bor_policy):
    """TestClient factory over the real app with the fast fake embedder; kwargs override settings."""
    from fastapi.testclient import TestClient

    from registry.index.embed import HashingEmbedder
    from service.app import create_app

    def make(**overrides):
        app = create_app(
            settings.model_copy(update=overrides),
            embedder_factory=lambda _: HashingEmbedder(),
            bor_policy=bor_policy,
            background_load=False,
        )
        return TestClient(app, raise_server_exceptions=False)

    return make


@pytest.fixture
def client(make_client):
    with make_client() as c:
        yield c


@pytest.fixture(scope="session")
def minilm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real embedder cache per test session: the MiniLM export and the tuned default composed
    from it (about 15 s), so servers started on it load what they would serve by default."""
    from registry.index.minilm_export import ensure_embedder_onnx, ensure_minilm_onnx
    from service.settings import ServiceSettings

    cache = tmp_path_factory.mktemp("embedder")
    ensure_minilm_onnx(cache)
    ensure_embedder_onnx(cache, "tuned", ServiceSettings().tuned_embedder_dir)
    return cache


@pytest.fixture(scope="session")
def minilm(minilm_cache: Path):
    from registry.index.embedders import load_minilm

    return load_minilm(minilm_cache)


def weather_tools() -> list[dict]:
    return [
        {"name": "get_weather", "description": "Current weather for a city.",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
        {"type": "function", "function": {"name": "send_email", "description": "Send an email.",
         "parameters": {"type": "object", "properties": {"to": {"type": "string"}}}}},
        {"name": "convert_currency", "description": "Convert money between currencies.",
         "input_schema": {"type": "object", "properties": {"amount": {"type": "number"}}}},
        {"name": "fs/read_file", "description": "Read a file from disk.",
         "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}},
    ]


@pytest.fixture
def tools_payload() -> list[dict]:
    return weather_tools()


@pytest.fixture
def engine(settings, hashing_embedder, bor_policy) -> Iterator:
    from tests.cores import new_engine

    yield new_engine(settings, embedder=hashing_embedder, bor_policy=bor_policy)


@pytest.fixture
def server_factory(tmp_path, minilm_cache):
    """Start real server processes sharing one data dir (``data_dir=`` for another; ``wait=False``
    to return before /readyz is 200); all are killed at teardown."""
    from tests.server import Servers

    servers = Servers(tmp_path, minilm_cache)
    yield servers.start
    servers.close()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """One throwaway `redis-server` for the session, nothing persisted; tests isolate themselves
    with a key prefix of their own (``redis_prefix``)."""
    from tests.redis_server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def make_core(settings, bor_policy):
    """Cores built from the test settings (hashing embedder), closed after the test."""
    from tests.cores import new_core

    cores = []

    def make(start: bool = True, **overrides):
        core = new_core(settings, bor_policy=bor_policy, start=start, **overrides)
        cores.append(core)
        return core

    yield make
    for core in cores:
        core.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its file's kind (tests/kinds.py) unless it is marked with one itself."""
    from tests.kinds import KINDS, kind_of

    for item in items:
        if any(item.get_closest_marker(kind) for kind in KINDS):
            continue
        kind = kind_of(item.path.stem)
        if kind is not None:
            item.add_marker(kind)
