"""/metrics stays small at any registry count (issue 23 item 9): past
SHORTLIST_METRICS_MAX_REGISTRIES registries, the rest are summed under registry="~other"."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from service.metrics import OTHER_REGISTRIES, RegistryLabels


def _samples(text: str) -> dict[str, dict[str, float]]:
    """metric sample name -> registry label -> value summed over the other labels."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            registry = sample.labels.get("registry")
            if registry is not None:
                out[sample.name][registry] += sample.value
    return out


def _registries(text: str) -> set[str]:
    return {r for by_registry in _samples(text).values() for r in by_registry}


def _tools(i: int) -> list[dict]:
    return [{"name": f"tool_{j}", "description": f"tool {j} of registry {i}: weather, mail, files"}
            for j in range(1 + i % 3)]


def test_300_registries_export_at_most_the_bound_and_fold_the_rest(client):
    registries = 300
    for i in range(registries):
        assert client.put(f"/registries/r{i:03d}", json=_tools(i)).status_code == 200
    served = [0, 1, 150, 299]  # two with series of their own, two folded
    for i in served:
        sl = client.post("/shortlist", json={"registry": f"r{i:03d}", "query": "weather"}).json()
        r = client.post("/feedback", json={"shortlist_id": sl["shortlist_id"], "used": ["tool_0"]})
        assert r.status_code == 200, r.text
    text = client.get("/metrics").text
    labels = _registries(text)
    assert len(labels) <= 101  # the default bound, 100, plus ~other
    assert OTHER_REGISTRIES in labels
    assert {"r000", "r001"} <= labels and "r150" not in labels and "r299" not in labels
    samples = _samples(text)
    # Nothing is lost: every shortlist and event is counted, the folded ones under ~other.
    assert sum(samples["shortlist_requests_total"].values()) == len(served)
    assert samples["shortlist_requests_total"][OTHER_REGISTRIES] == 2
    assert samples["shortlist_feedback_total"][OTHER_REGISTRIES] == 2
    assert samples["shortlist_k_count"][OTHER_REGISTRIES] == 2
    folded_tools = sum(len(_tools(i)) for i in range(100, registries))
    assert samples["shortlist_registry_tools"][OTHER_REGISTRIES] == folded_tools
    assert OTHER_REGISTRIES not in samples["shortlist_registry_version"]  # a version has no sum
    assert "shortlist_metrics_folded_registries 200.0" in text
    assert len(text.encode()) < 100_000

    # Deleting a folded registry takes its tools out of ~other; deleting one with its own
    # series frees its place for the next new registry.
    assert client.delete("/registries/r150").status_code in (200, 204)
    assert client.delete("/registries/r000").status_code in (200, 204)
    assert client.put("/registries/fresh", json=_tools(0)).status_code == 200
    after = client.get("/metrics").text
    samples = _samples(after)
    assert samples["shortlist_registry_tools"][OTHER_REGISTRIES] == folded_tools - len(_tools(150))
    assert "shortlist_metrics_folded_registries 199.0" in after
    assert "r000" not in _registries(after)
    assert samples["shortlist_registry_tools"]["fresh"] == 1
    assert samples["shortlist_requests_total"][OTHER_REGISTRIES] == 2  # counters never go back


def test_the_setting_bounds_the_registries_with_series_of_their_own(make_client):
    with make_client(metrics_max_registries=2) as client:
        for name in ("a", "b", "c", "d"):
            client.put(f"/registries/{name}", json=_tools(0))
            sl = client.post("/shortlist", json={"registry": name, "query": "weather"}).json()
            client.post("/feedback", json={"shortlist_id": sl["shortlist_id"], "used": ["tool_0"]})
        text = client.get("/metrics").text
        assert _registries(text) == {"a", "b", OTHER_REGISTRIES}
        live = _samples(text)["shortlist_presentation_rate"]
        assert set(live) == {"a", "b"}  # a window's rate does not sum: folded ones are not shown
    with make_client(metrics_max_registries=0) as client:
        client.put("/registries/a", json=_tools(0))
        assert _registries(client.get("/metrics").text) == {OTHER_REGISTRIES}


def test_a_registry_keeps_its_label_until_it_is_deleted():
    labels = RegistryLabels(2)
    assert [labels.label(r) for r in ("a", "b", "c")] == ["a", "b", OTHER_REGISTRIES]
    labels.forget("a")
    assert labels.label("c") == OTHER_REGISTRIES  # folded stays folded: its counters stay put
    assert labels.label("d") == "d"  # a's place goes to the next new registry
    assert labels.folded == 1 and labels.owns("b") and not labels.owns("c")
