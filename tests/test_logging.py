"""Logs: the request id (header, JSON lines), the JSON format, and no import noise."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys

import pytest

from service.logging_setup import REQUEST_ID, accept_request_id, configure_logging
from tests.conftest import ROOT


@pytest.fixture
def json_log():
    """JSON log lines captured from the root logger (the previous handlers are put back)."""
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    try:
        yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved_handlers:
            root.addHandler(handler)
        root.setLevel(saved_level)


def test_request_id_is_generated_and_returned(client):
    first = client.get("/healthz").headers["X-Request-ID"]
    second = client.get("/healthz").headers["X-Request-ID"]
    assert len(first) == 32 and first != second
    int(first, 16)


def test_a_sane_incoming_request_id_is_kept_and_a_bad_one_replaced(client):
    r = client.get("/healthz", headers={"X-Request-ID": "trace-42.a:b"})
    assert r.headers["X-Request-ID"] == "trace-42.a:b"
    for bad in ("has space", "x" * 129, 'quote"d', "new\tline"):
        got = client.get("/healthz", headers={"X-Request-ID": bad}).headers["X-Request-ID"]
        assert got != bad and len(got) == 32


def test_every_response_carries_the_request_id_errors_included(make_client, tools_payload):
    with make_client(max_body_bytes=2048) as client:
        responses = {
            404: client.get("/registries/nope"),
            405: client.delete("/healthz"),
            413: client.put("/registries/r", json=[{"name": f"t{i}", "description": "x" * 200} for i in range(20)]),
            422: client.put("/registries/bad%20name", json=tools_payload),
            200: client.get("/metrics"),
        }
    for status, response in responses.items():
        assert response.status_code == status, response.text
        assert len(response.headers["X-Request-ID"]) == 32, status


def test_an_unexpected_error_is_a_500_with_the_request_id(make_client, monkeypatch, json_log):
    with make_client() as client:
        state = client.app.state.service

        def boom(*args, **kwargs):
            raise RuntimeError("boom")

        monkeypatch.setattr(state.core, "shortlist", boom)
        r = client.post("/shortlist", json={"registry": "demo", "query": "x"}, headers={"X-Request-ID": "rid-500"})
    assert r.status_code == 500 and r.headers["X-Request-ID"] == "rid-500"
    assert r.json()["error"]["type"] == "internal"
    errors = [line for line in json_log() if line["level"] == "ERROR"]
    assert errors and errors[0]["request_id"] == "rid-500" and "boom" in errors[0]["exc"]


def test_json_log_lines_carry_the_request_id(make_client, json_log):
    with make_client() as client:
        client.get("/registries/missing", headers={"X-Request-ID": "abc-123"})
        logging.getLogger("service.test").info("inside no request")
    lines = json_log()
    assert lines, "nothing logged"
    for line in lines:
        assert {"ts", "level", "logger", "message"} <= set(line)
    outside = [line for line in lines if line["message"] == "inside no request"]
    assert outside and "request_id" not in outside[0]


def test_json_formatter_fields_and_request_id_context(json_log):
    token = REQUEST_ID.set("rid-1")
    try:
        logging.getLogger("uvicorn.access").info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/healthz", "1.1", 200
        )
    finally:
        REQUEST_ID.reset(token)
    (line,) = json_log()
    assert line["request_id"] == "rid-1" and line["logger"] == "uvicorn.access"
    assert (line["method"], line["path"], line["status"], line["client"]) == ("GET", "/healthz", 200, "127.0.0.1:5")
    assert line["ts"].endswith("+00:00")


def test_accept_request_id():
    assert accept_request_id("0af7651916cd43dd8448eb211c80319c") == "0af7651916cd43dd8448eb211c80319c"
    assert accept_request_id("Root=1-5759e988;Parent=53995c3f") == "Root=1-5759e988;Parent=53995c3f"
    for bad in (None, "", "a b", "é", "x\n", "x" * 129):
        assert len(accept_request_id(bad)) == 32


NOISE_SCRIPT = """
import logging, sys
from service.logging_setup import configure_logging
configure_logging("info", sys.argv[1])
import faiss  # noqa: F401  (its loader logs every build it fails to load at INFO)
from registry.index.lexical import LexicalIndex
LexicalIndex(["send an email", "read a file"])  # bm25s logs 'Building index' at DEBUG
from registry.index.embed import HashingEmbedder
from service.settings import ServiceSettings
from service.app import create_app
from fastapi.testclient import TestClient
settings = ServiceSettings(data_dir=sys.argv[2], demo_registry=None, admin_token="a", query_token="q")
with TestClient(create_app(settings, embedder_factory=lambda _: HashingEmbedder(),
                           background_load=False)) as client:
    client.get("/healthz")
logging.getLogger("shortlist").info("end of start")
"""


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_importing_and_starting_emit_no_faiss_or_bm25s_noise(tmp_path, fmt):
    proc = subprocess.run(
        [sys.executable, "-c", NOISE_SCRIPT, fmt, str(tmp_path / "data")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    log = proc.stderr
    assert "end of start" in log  # INFO lines do get through
    for noise in ("faiss.loader", "ModuleNotFoundError", "bm25s", "Building index", "StreamableHTTP"):
        assert noise not in log, (noise, log)
    if fmt == "json":
        for line in log.splitlines():
            json.loads(line)


def test_progress_step_logs_start_heartbeat_and_end(caplog):
    import time

    from registry.offline.cli_support import progress_step

    log = logging.getLogger("registry.test_progress")
    with (
        caplog.at_level(logging.INFO, logger="registry.test_progress"),
        progress_step(log, "slow step", expected_seconds=1.0, heartbeat=0.05),
    ):
        time.sleep(0.2)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "slow step (about 1 s)..."
    assert messages[1:-1] and all(
        re.fullmatch(r"slow step: still running \(\d+ s of about 1 s\)", m) for m in messages[1:-1]
    ), messages
    done = re.fullmatch(r"slow step: done in (\d+\.\d) s", messages[-1])
    assert done and float(done.group(1)) >= 0.2, messages[-1]


def test_progress_embedder_returns_the_same_vectors_and_estimates_the_next_call(caplog):
    import numpy as np

    from registry.index.embed import HashingEmbedder
    from registry.offline.cli_support import ProgressEmbedder

    inner = HashingEmbedder()
    texts = [f"query number {i} about weather and email" for i in range(1200)]
    wrapped = ProgressEmbedder(inner, logging.getLogger("registry.test_embed"), label="queries")
    assert wrapped.model_id == inner.model_id and wrapped.dim == inner.dim
    with caplog.at_level(logging.INFO, logger="registry.test_embed"):
        small = wrapped.embed_documents(texts[:10])
        assert caplog.records == []  # small calls are silent
        first = wrapped.embed_documents(texts)
        second = wrapped.embed_documents(texts)
    assert np.array_equal(small, inner.embed_documents(texts[:10]))
    assert np.array_equal(first, inner.embed_documents(texts)) and np.array_equal(second, first)
    starts = [r.getMessage() for r in caplog.records if r.getMessage().endswith("...")]
    assert starts[0].startswith("embedding 1,200 queries")
    assert len(starts) == 2
