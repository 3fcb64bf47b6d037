"""Schemathesis fuzzing of the whole HTTP API, in process, against its own OpenAPI schema.

Every operation gets generated requests, valid and invalid (bounded, derandomised so CI is
reproducible). Every response must be a non-5xx that the schema documents: status code,
content type, headers and body. Tokens are configured, so the auth dependencies and the 401
documentation are fuzzed too, and ``ignored_auth`` re-sends requests without a token to check
that they are refused. Two registries are seeded (and re-seeded if a fuzzed DELETE removes one),
and half the requests are steered at them, so /shortlist, /feedback, reads and upserts also
run on a real registry, with real shortlist ids and real tool names.
"""

from __future__ import annotations

import atexit
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from registry.index.embed import HashingEmbedder
from registry.name_checks import REGISTRY_NAME_PATTERN
from service.app import create_app
from service.schemas import MAX_USED_TOOLS
from service.schemas_openapi import MAX_TOOL_NAME_CHARS
from service.settings import ServiceSettings
from tests.conftest import ROOT

ADMIN = "fuzz-admin-token-0123456789"
QUERY = "fuzz-query-token-0123456789"
DEMO = "demo"  # queried and read, never written by steered requests
SCRATCH = "scratch"  # steered writes land here, on a registry that already holds tools

# Positive-data acceptance is left out on purpose: some rules are semantic (unique tool names,
# feedback naming tools of the registry) and answer 422 to schema-valid input.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    ignored_auth,
]


def demo_payload() -> Any:
    return json.loads((ROOT / "examples" / "demo_tools.json").read_text())


def _build_app() -> tuple[Any, Path]:
    # Built at import: schemathesis' pytest integration needs the schema to make one test per
    # operation (its fixture-based loader does not work with pytest 9).
    data_dir = Path(tempfile.mkdtemp(prefix="shortlist-fuzz-"))
    app = create_app(
        ServiceSettings(
            data_dir=data_dir / "data",
            demo_registry=None,
            admin_token=(SecretStr(ADMIN),),
            query_token=(SecretStr(QUERY),),
            max_body_bytes=1024 * 1024,
            allowed_hosts=("*",),  # schemathesis' ASGI client names its own host
        ),
        embedder_factory=lambda _: HashingEmbedder(),
        background_load=False,
    )
    return app, data_dir


APP, DATA_DIR = _build_app()
atexit.register(shutil.rmtree, DATA_DIR, ignore_errors=True)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
# A body over a byte limit is refused with 413 before it is validated: a rejection too.
_negative = schema.config.checks.negative_data_rejection
_negative.expected_statuses = [*_negative.expected_statuses, "413"]


SEED: dict[str, list[str]] = {"tools": [], "shortlist_ids": []}


@pytest.fixture(scope="module", autouse=True)
def seeded() -> Iterator[None]:
    """Seed the 'demo' registry and real shortlist ids (served through the API)."""
    state = APP.state.service
    assert state.wait_ready(30), state.load_error
    reseed()
    SEED["tools"] = sorted(state.core.snapshot(DEMO).by_name)
    client = TestClient(APP)  # no `with`: the lifespan already ran
    query_token = {"Authorization": f"Bearer {QUERY}"}
    SEED["shortlist_ids"] = [
        client.post("/shortlist", json={"registry": DEMO, "query": q}, headers=query_token).json()[
            "shortlist_id"
        ]
        for q in ("weather in Paris", "send an email", "convert 20 euros to yen")
    ]
    yield


def reseed() -> None:
    core = APP.state.service.core
    for name in (DEMO, SCRATCH):
        if not core.snapshots.has_registry(name):
            core.writer.put_registry(name, demo_payload())


# Half of the generated requests are steered at the seeded registry. Only a value that is
# already valid is swapped (for another valid one), so a negative case stays negative.
_NAME = re.compile(REGISTRY_NAME_PATTERN)


def _valid_name(value: Any) -> bool:
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def _valid_tool_names(value: Any) -> bool:
    return (
        isinstance(value, list)
        and 0 < len(value) <= MAX_USED_TOOLS
        and all(isinstance(v, str) and 0 < len(v) <= MAX_TOOL_NAME_CHARS for v in value)
    )


def _valid_calls(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(c, dict)
        and set(c) == {"tool", "useful"}
        and _valid_tool_names([c["tool"]])
        and isinstance(c["useful"], bool)
        for c in value
    )


@schema.hook
def flatmap_body(context: Any, body: Any) -> Any:
    path = context.operation.path
    if not isinstance(body, dict):
        return st.just(body)
    if path == "/shortlist" and _valid_name(body.get("registry")):
        return st.sampled_from([body, {**body, "registry": DEMO}])
    if path == "/feedback":
        shortlist_id = body.get("shortlist_id")
        if not (isinstance(shortlist_id, str) and 0 < len(shortlist_id) <= 128):
            return st.just(body)
        steered: dict[str, st.SearchStrategy[Any]] = {
            "shortlist_id": st.sampled_from(SEED["shortlist_ids"])
        }
        tool = st.sampled_from(SEED["tools"])
        if _valid_tool_names(body.get("used")):
            steered["used"] = st.lists(tool, min_size=1, max_size=3)
        if _valid_calls(body.get("calls")):
            call = st.fixed_dictionaries({"tool": tool, "useful": st.booleans()})
            steered["calls"] = st.lists(call, max_size=3)
        real = st.fixed_dictionaries(steered).map(lambda fields: {**body, **fields})
        return st.one_of(st.just(body), real)
    return st.just(body)


@schema.hook
def flatmap_path_parameters(context: Any, parameters: dict[str, Any] | None) -> Any:
    method = context.operation.method.lower()
    # DELETEs are not steered: fuzzed names may still hit a seeded registry, and reseed() copes.
    if not parameters or not _valid_name(parameters.get("registry")) or method == "delete":
        return st.just(parameters)
    targets = [SCRATCH] if method in ("put", "post") else [DEMO, SCRATCH]
    return st.sampled_from([parameters, *({**parameters, "registry": t} for t in targets)])


@schema.parametrize()
@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api_fuzz(case: Any) -> None:
    reseed()
    case.call_and_validate(headers={"Authorization": f"Bearer {ADMIN}"}, checks=CHECKS)
