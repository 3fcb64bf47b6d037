"""HTTP API through TestClient with the fake embedder: shapes, errors, limits, metrics."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from registry.index.embed import HashingEmbedder
from service.app import create_app


def assert_error(response, status: int, error_type: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "details"}
    assert body["error"]["type"] == error_type
    return body["error"]


def test_registry_lifecycle(client, tools_payload):
    r = client.put("/registries/tools-1", json=tools_payload)
    first = r.json()
    assert r.status_code == 200 and isinstance(first.pop("written_at"), float)
    assert first == {"registry": "tools-1", "version": 1, "tools": 4}
    r = client.post("/registries/tools-1/tools", json={"tools": [{"name": "extra", "description": "x"}]})
    written = r.json()["written_at"]  # when the version was written (tests/test_console.py)
    assert r.json() == {"registry": "tools-1", "version": 2, "tools": 5, "written_at": written}
    assert client.get("/registries").json() == {
        "registries": [{"registry": "tools-1", "version": 2, "tools": 5, "written_at": written}]
    }
    got = client.get("/registries/tools-1").json()
    assert got["version"] == 2 and got["tools"][:4] == tools_payload  # exactly as uploaded
    assert client.delete("/registries/tools-1/tools/fs/read_file").status_code == 204
    assert client.get("/registries/tools-1").json()["version"] == 3
    assert client.delete("/registries/tools-1").status_code == 204
    assert_error(client.get("/registries/tools-1"), 404, "not_found")


def test_shortlist_response(client, tools_payload):
    client.put("/registries/r", json=tools_payload)
    r = client.post("/shortlist", json={"registry": "r", "query": "weather in Oslo"})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {
        "shortlist_id", "registry", "version", "policy", "scorer", "k", "n_tools", "p_rand",
        "bor_max_bits", "depth_bias", "intents", "confidence", "policy_version", "tools",
    }
    assert body["intents"] == [] and body["confidence"] is None  # one intent, allow_empty unset
    assert set(body["tools"][0]) == {"name", "rank", "score", "definition", "alternates", "intent", "named", "reason"}
    assert body["tools"][0]["reason"] is None  # ranked, not added by a chain
    assert body["depth_bias"] == 0.0
    assert body["policy"] == "bor" and body["scorer"] == "hybrid" and body["n_tools"] == 4
    assert body["k"] == len(body["tools"]) >= 1
    assert body["tools"][0]["name"] == "get_weather"
    assert body["tools"][0]["definition"] == tools_payload[0]
    fixed = client.post("/shortlist", json={"registry": "r", "query": "weather", "k": 50}).json()
    assert fixed["k"] == 4 and fixed["policy"] == "fixed" and fixed["depth_bias"] is None
    longest = client.post("/shortlist", json={"registry": "r", "query": "weather", "depth_bias": 10}).json()
    assert (longest["k"], longest["depth_bias"]) == (4, 10.0)
    shortest = client.post("/shortlist", json={"registry": "r", "query": "weather", "depth_bias": -10}).json()
    assert shortest["k"] == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({"registry": "r"}, "query"),
        ({"registry": "r", "query": "q", "k": 0}, "k"),
        ({"registry": "r", "query": "q", "k": 1001}, "k"),
        ({"registry": "r", "query": "q", "k": "many"}, "k"),
        ({"registry": "r", "query": "q", "policy": "nope"}, "policy"),
        ({"registry": "r", "query": "q", "unexpected": 1}, "unexpected"),
        ({"registry": "r", "query": "q", "depth_bias": 11}, "depth_bias"),
        ({"registry": "r", "query": "q", "depth_bias": "longer"}, "depth_bias"),
        ({"registry": "r", "query": "q", "depth_bias": 1, "policy": "gap"}, "depth_bias"),
        ({"registry": "r", "query": "q", "depth_bias": 1, "k": 2}, "depth_bias"),
    ],
)
def test_bad_shortlist_requests_are_422(client, tools_payload, body, field):
    client.put("/registries/r", json=tools_payload)
    error = assert_error(client.post("/shortlist", json=body), 422, "validation")
    assert field in json.dumps(error["details"])


def test_invalid_tools_are_422_with_every_problem_and_nothing_stored(client, tools_payload):
    client.put("/registries/r", json=tools_payload)
    bad = [{"name": "ok"}, {"name": ""}, {"type": "function", "function": {"description": "x"}}, 7]
    error = assert_error(client.put("/registries/r", json=bad), 422, "validation")
    assert sorted(d["index"] for d in error["details"]) == [1, 2, 3]
    assert client.get("/registries/r").json()["version"] == 1


@pytest.mark.parametrize(
    "raw, status",
    [(b"{not json", 422), (b"", 422), (b'"a string"', 422), (b'{"tools": 3}', 422)],
)
def test_malformed_bodies(client, raw, status):
    r = client.put("/registries/r", content=raw, headers={"content-type": "application/json"})
    assert_error(r, status, "validation")
    assert_error(client.get("/registries/r"), 404, "not_found")


def test_bad_registry_name_is_422(client, tools_payload):
    error = assert_error(client.put("/registries/bad%20name", json=tools_payload), 422, "validation")
    assert "registry" in error["message"]


def test_body_limit_is_413(make_client, tools_payload):
    with make_client(max_body_bytes=2048) as client:
        big = [{"name": f"t{i}", "description": "x" * 200} for i in range(20)]
        assert_error(client.put("/registries/r", json=big), 413, "payload_too_large")
        assert client.put("/registries/r", json=tools_payload).status_code == 200


def test_too_many_tools_is_413(make_client, tools_payload):
    with make_client(max_tools_per_registry=3) as client:
        assert_error(client.put("/registries/r", json=tools_payload), 413, "payload_too_large")


def test_health_readiness_and_metrics(client, tools_payload):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    client.put("/registries/r", json=tools_payload)
    client.post("/shortlist", json={"registry": "r", "query": "send an email"})
    text = client.get("/metrics").text
    for name in (
        'shortlist_request_duration_seconds_bucket{le="0.005",stage="embed"}',
        'shortlist_requests_total{policy="bor",registry="r"} 1.0',
        'shortlist_k_count{registry="r"} 1.0',
        'shortlist_registry_tools{registry="r"} 4.0',
        'shortlist_http_requests_total{method="POST",route="/shortlist",status="200"} 1.0',
    ):
        assert name in text, name


def test_not_ready_is_503(settings, bor_policy):
    import threading

    gate = threading.Event()

    def slow_embedder(_):
        gate.wait(10)
        return HashingEmbedder()

    app = create_app(settings, embedder_factory=slow_embedder, bor_policy=bor_policy)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        assert_error(client.get("/readyz"), 503, "unhealthy")
        assert_error(client.post("/shortlist", json={"registry": "r", "query": "q"}), 503, "unhealthy")
        gate.set()
        app.state.service.wait_ready(10)
        assert client.get("/readyz").status_code == 200


def test_openapi_documents_every_route_with_examples(client):
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {"/shortlist", "/registries", "/registries/{registry}", "/registries/{registry}/tools",
            "/healthz", "/readyz", "/metrics"} <= set(paths)
    put = paths["/registries/{registry}"]["put"]
    assert put["requestBody"]["content"]["application/json"]["examples"]
    assert spec["components"]["schemas"]["ShortlistRequest"]["examples"]


def test_demo_registry_is_loaded(make_client):
    from registry.settings import Settings
    from service.state import DEMO_REGISTRY

    with make_client(demo_registry=Settings().demo_registry) as client:
        registries = client.get("/registries").json()["registries"]
        assert [r["registry"] for r in registries] == [DEMO_REGISTRY]
        assert registries[0]["tools"] >= 20


def test_every_metric_the_dashboards_use_is_exported(client, tools_payload):
    from prometheus_client.parser import text_string_to_metric_families

    from tests.test_deploy import EXPORTED_METRICS

    client.put("/registries/r", json=tools_payload)
    sl = client.post("/shortlist", json={"registry": "r", "query": "weather in Oslo"}).json()
    used = sl["tools"][0]["name"]
    r = client.post("/feedback", json={"shortlist_id": sl["shortlist_id"], "used": [used]})
    assert r.status_code == 200, r.text
    exported = {
        sample.name
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
    }
    assert set(EXPORTED_METRICS) <= exported, set(EXPORTED_METRICS) - exported


def test_feedback_validation_through_the_api(client, tools_payload):
    client.put("/registries/r", json={"tools": tools_payload, "equivalents": [["get_weather", "fs/read_file"]]})
    sl = client.post("/shortlist", json={"registry": "r", "query": "weather"}).json()
    assert_error(client.post("/feedback", json={"shortlist_id": "nope", "used": ["x"]}), 404, "not_found")
    error = assert_error(
        client.post("/feedback", json={"shortlist_id": sl["shortlist_id"], "used": ["get_weather", "ghost"]}),
        422, "validation",
    )
    assert "ghost" in json.dumps(error["details"])
    error = assert_error(
        client.post("/feedback", json={"shortlist_id": sl["shortlist_id"], "used": ["get_weather"],
                                       "calls": [{"tool": "get_weather"}]}),
        422, "validation",
    )
    assert "calls.0.useful" in json.dumps(error["details"])
    ok = client.post("/feedback", json={"shortlist_id": sl["shortlist_id"], "used": ["fs/read_file"]})
    assert ok.status_code == 200 and ok.json()["duplicate"] is False


def test_equivalents_are_validated_and_kept_on_upsert(client, tools_payload):
    error = assert_error(
        client.put("/registries/r", json={"tools": tools_payload, "equivalents": [["get_weather", "ghost"]]}),
        422, "validation",
    )
    assert error["details"][0]["field"] == "equivalents[0][1]"
    assert_error(client.get("/registries/r"), 404, "not_found")  # nothing stored
    client.put("/registries/r", json={"tools": tools_payload, "equivalents": [["get_weather", "send_email"]]})
    client.post("/registries/r/tools", json=[{"name": "new_tool", "description": "new"}])
    assert client.get("/registries/r").json()["equivalents"] == [["get_weather", "send_email"]]
    client.post("/registries/r/tools", json={"tools": [], "equivalents": [["new_tool", "fs/read_file"]]})
    assert client.get("/registries/r").json()["equivalents"] == [
        ["fs/read_file", "new_tool"], ["get_weather", "send_email"]
    ]
    client.delete("/registries/r/tools/send_email")
    assert client.get("/registries/r").json()["equivalents"] == [["fs/read_file", "new_tool"]]


def test_readyz_shows_no_absolute_paths(settings, bor_policy):
    """/readyz is open: a load failure's reason keeps a file's name, not where it lives."""
    from fastapi.testclient import TestClient

    from service.app import create_app

    def broken(_):
        raise FileNotFoundError(2, "No such file or directory", "/srv/secret/place/model.onnx")

    app = create_app(settings, embedder_factory=broken, bor_policy=bor_policy, background_load=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/readyz")
        assert r.status_code == 503, r.text
        assert "model.onnx" in r.text and "/srv/secret" not in r.text
