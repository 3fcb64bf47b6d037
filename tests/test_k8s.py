"""Kubernetes manifests in deploy/k8s, checked statically (no cluster, no kubeconform here).

Each file parses to one resource of the expected kind; labels, selectors and ports agree; every
SHORTLIST_* variable is a ServiceSettings field; probes hit /readyz and /healthz; the PrometheusRule
carries exactly the rules of deploy/prometheus/rules/*.yml. After changing those rules:

    .venv/bin/python -m tests.test_k8s      # rewrites deploy/k8s/prometheusrule.yaml
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.settings import ServiceSettings

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
RULES = [ROOT / "deploy" / "prometheus" / "rules" / name for name in ("recording.yml", "alerts.yml")]
NAME = "tool-shortlist"
SELECTOR = {"app.kubernetes.io/name": NAME}

KINDS = {
    "configmap.yaml": ("v1", "ConfigMap"),
    "deployment.yaml": ("apps/v1", "Deployment"),
    "service.yaml": ("v1", "Service"),
    "hpa.yaml": ("autoscaling/v2", "HorizontalPodAutoscaler"),
    "pdb.yaml": ("policy/v1", "PodDisruptionBudget"),
    "servicemonitor.yaml": ("monitoring.coreos.com/v1", "ServiceMonitor"),
    "prometheusrule.yaml": ("monitoring.coreos.com/v1", "PrometheusRule"),
}


def load(name: str) -> dict[str, Any]:
    with (K8S / name).open() as f:
        doc = yaml.safe_load(f)
    assert isinstance(doc, dict), name
    return doc


def settings_env() -> set[str]:
    return {f"SHORTLIST_{field.upper()}" for field in ServiceSettings.model_fields}


def prometheus_rule() -> dict[str, Any]:
    """The PrometheusRule resource holding every rule group of deploy/prometheus/rules."""
    groups = []
    for path in RULES:
        with path.open() as f:
            groups += yaml.safe_load(f)["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": NAME, "labels": {**SELECTOR, "app.kubernetes.io/component": "api"}},
        "spec": {"groups": groups},
    }


def container() -> dict[str, Any]:
    (c,) = load("deployment.yaml")["spec"]["template"]["spec"]["containers"]
    return c


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_manifest_is_one_resource_of_its_kind(name: str) -> None:
    doc = load(name)
    assert (doc["apiVersion"], doc["kind"]) == KINDS[name]
    assert doc["metadata"]["name"] == NAME
    assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == NAME


def test_kustomization_lists_every_manifest() -> None:
    kustomization = load("kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == sorted(KINDS)
    yaml_files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert yaml_files == set(KINDS)
    (image,) = kustomization["images"]
    assert image["name"] == container()["image"]


def test_selectors_labels_and_ports_agree() -> None:
    deployment = load("deployment.yaml")
    spec = deployment["spec"]
    assert spec["selector"]["matchLabels"] == SELECTOR
    pod_labels = spec["template"]["metadata"]["labels"]
    assert SELECTOR.items() <= pod_labels.items()
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert ports == {"http": ServiceSettings.model_fields["port"].default}

    service = load("service.yaml")
    assert service["spec"]["selector"] == SELECTOR
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in ("http", ports["http"])

    monitor = load("servicemonitor.yaml")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"

    hpa = load("hpa.yaml")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1", "Deployment", deployment["metadata"]["name"],
    )
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    # Utilisation targets need requests to be measured against.
    assert container()["resources"]["requests"]["cpu"]

    assert load("pdb.yaml")["spec"]["selector"]["matchLabels"] == SELECTOR


def test_probes_and_security() -> None:
    c = container()
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] in ("http", 8080)
    pod = load("deployment.yaml")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


def _mebibytes(quantity: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Mi|Gi)", quantity)
    assert match, quantity
    return float(match.group(1)) * (1024 if match.group(2) == "Gi" else 1)


def test_memory_is_sized_from_the_measurement_in_docs() -> None:
    resources = container()["resources"]
    request = _mebibytes(resources["requests"]["memory"])
    limit = _mebibytes(resources["limits"]["memory"])
    doc = (ROOT / "docs" / "scaling.md").read_text()
    # The doc records the peak RSS of one replica with a 4,000-tool registry as "peak RSS: N MiB".
    match = re.search(r"peak RSS: (\d+) MiB", doc)
    assert match, "docs/scaling.md must state the measured peak RSS"
    peak = float(match.group(1))
    assert peak <= request <= 1.5 * peak
    assert limit >= request


def test_env_names_are_settings() -> None:
    known = settings_env()
    c = container()
    names = {e["name"] for e in c["env"]} | set(load("configmap.yaml")["data"])
    shortlist = {n for n in names if n.startswith("SHORTLIST_")}
    assert shortlist <= known, shortlist - known
    assert "SHORTLIST_REDIS_URL" in {e["name"] for e in c["env"]}
    redis_url = next(e for e in c["env"] if e["name"] == "SHORTLIST_REDIS_URL")
    assert "secretKeyRef" in redis_url["valueFrom"]  # it may hold a password
    assert "SHORTLIST_REDIS_URL" not in load("configmap.yaml")["data"]
    (source,) = c["envFrom"]
    assert source["configMapRef"]["name"] == load("configmap.yaml")["metadata"]["name"]
    port = next(e["value"] for e in c["env"] if e["name"] == "SHORTLIST_PORT")
    assert int(port) == c["ports"][0]["containerPort"]


def test_prometheus_rule_embeds_the_rule_files() -> None:
    assert load("prometheusrule.yaml") == prometheus_rule(), (
        "deploy/k8s/prometheusrule.yaml is out of date: run `.venv/bin/python -m tests.test_k8s`"
    )
    alerts = {r["alert"] for g in load("prometheusrule.yaml")["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"ShortlistNotReady", "ShortlistTargetDown", "ShortlistStoreDown"} <= alerts


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, descriptions) as literal blocks, as in the rule files."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockDumper.add_representer(str, _str)


def write_prometheus_rule() -> Path:
    path = K8S / "prometheusrule.yaml"
    header = (
        "# Generated from deploy/prometheus/rules/{recording,alerts}.yml by\n"
        "# `.venv/bin/python -m tests.test_k8s`; tests/test_k8s.py checks it is up to date.\n"
        "# Your Prometheus Operator's ruleSelector may require an extra label (e.g. `release`).\n"
    )
    body = yaml.dump(
        prometheus_rule(), Dumper=_BlockDumper, sort_keys=False, width=100, allow_unicode=True
    )
    path.write_text(header + body)
    return path


if __name__ == "__main__":
    print(f"wrote {write_prometheus_rule()}")
