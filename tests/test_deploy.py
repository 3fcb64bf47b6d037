"""Deployment files: Prometheus config and rules, Grafana provisioning and the dashboard.

Every query in deploy/ may only use metric names the service exports (EXPORTED_METRICS) or the
recording rules defined in deploy/prometheus/rules/recording.yml, so a renamed metric breaks a
test instead of silently emptying a panel or disarming an alert. When `promtool` is on PATH the
rule files, the config, the rule unit tests and the dashboard's PromQL are checked by it; when it
is not, the same files get structural checks in Python (nothing is skipped).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

# Every metric name as it appears in the service's /metrics output (prometheus_client appends
# _total to counters and _bucket/_sum/_count to histograms). The one list to keep in sync with
# service/metrics.py.
EXPORTED_METRICS: tuple[str, ...] = (
    "shortlist_request_duration_seconds_bucket",
    "shortlist_request_duration_seconds_sum",
    "shortlist_request_duration_seconds_count",
    "shortlist_requests_total",
    "shortlist_k_bucket",
    "shortlist_k_sum",
    "shortlist_k_count",
    "shortlist_registry_tools",
    "shortlist_registry_version",
    "shortlist_ready",
    "shortlist_store_up",
    "shortlist_http_requests_total",
    "shortlist_feedback_total",
    "shortlist_presented_total",
    "shortlist_feedback_p_rand_sum",  # counter-like (untyped: keeps the exact name)
    "shortlist_presentation_rate",
    "shortlist_live_bor_bits",
    "shortlist_metrics_folded_registries",
)

# Series Prometheus writes itself for every scrape target; rules may use them, panels do not.
PROMETHEUS_SERIES: tuple[str, ...] = ("up",)

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
PROM_DIR = DEPLOY / "prometheus"
PROM_CONFIG = PROM_DIR / "prometheus.yml"
RECORDING = PROM_DIR / "rules" / "recording.yml"
ALERTS = PROM_DIR / "rules" / "alerts.yml"
RULE_TESTS = PROM_DIR / "tests" / "rules_test.yml"
GRAFANA = DEPLOY / "grafana"
DATASOURCE = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDER = GRAFANA / "provisioning" / "dashboards" / "dashboards.yml"
DASHBOARD = GRAFANA / "dashboards" / "tool-shortlist.json"
README = DEPLOY / "README.md"

REQUIRED_ALERTS = {
    "ShortlistBoRDropped",
    "ShortlistPresentationRateLow",
    "ShortlistLatencyP99High",
    "ShortlistNoFeedback",
    "ShortlistNotReady",
}
REQUIRED_RECORDINGS = {
    f"registry_match:shortlist_{name}:rate{window}"
    for name in ("presentation_rate", "mean_p_rand", "bor_bits")
    for window in ("5m", "1h")
} | {
    "stage:shortlist_request_duration_seconds:p50_5m",
    "stage:shortlist_request_duration_seconds:p99_5m",
    "shortlist:requests:rate5m",
}
# Alerts whose output is per registry: their annotations must say which one.
REGISTRY_ALERTS = {"ShortlistBoRDropped", "ShortlistPresentationRateLow", "ShortlistNoFeedback"}
SEVERITIES = {"critical", "warning", "info"}

PROMTOOL = shutil.which("promtool")

# --- PromQL metric-name extraction ------------------------------------------------------------

_OPERATOR_WORDS = {"and", "or", "unless", "bool", "atan2", "offset", "inf", "nan"}
_MODIFIER_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = _OPERATOR_WORDS | _MODIFIER_WORDS
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_OFFSET_AT = re.compile(r"\boffset\s+-?[\w.]+|@\s*(?:start\(\)|end\(\)|[\d.]+)", re.IGNORECASE)
_LABEL_LIST = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric and recording-rule names a PromQL expression reads.

    Strips what may look like identifiers but are not series names: strings, Grafana variables,
    label matchers in {}, ranges in [], offsets, label lists of by/without/on/ignoring/group_*,
    function and aggregation names (an identifier followed by "("), keywords and numbers.
    """
    text = _STRING.sub(" ", expr)
    text = _GRAFANA_VAR.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _OFFSET_AT.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def test_metric_name_extractor() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, stage) (rate(a_bucket{stage="total",x=~"$registry"}'
        "[$__rate_interval])))\n"
        "  / on (registry) group_left () (b:c:rate5m > bool 1e-3)"
        " or -log2(d offset 1d) unless ignoring(match) sum(e) without (instance) + Inf"
    )
    assert metric_names(expr) == {"a_bucket", "b:c:rate5m", "d", "e"}
    assert metric_names("up{job='x'} == 0") == {"up"}
    assert metric_names("sum(rate(foo_total[5m])) by (registry)") == {"foo_total"}


# --- Loading ----------------------------------------------------------------------------------


def _yaml(path: Path) -> Any:
    with path.open() as f:
        return yaml.safe_load(f)


def _rules(path: Path) -> Iterator[dict[str, Any]]:
    for group in _yaml(path)["groups"]:
        yield from group["rules"]


def recording_names() -> set[str]:
    return {rule["record"] for rule in _rules(RECORDING)}


def allowed_names() -> set[str]:
    return set(EXPORTED_METRICS) | recording_names()


def _promtool(*args: str, cwd: Path | None = None) -> str:
    assert PROMTOOL is not None
    proc = subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
RULE_KEYS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


def _balanced(expr: str) -> bool:
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for ch in _STRING.sub("", expr):
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack


# --- (a) every YAML file parses ---------------------------------------------------------------


YAML_FILES = sorted(DEPLOY.rglob("*.yml")) + sorted(DEPLOY.rglob("*.yaml"))


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path: Path) -> None:
    assert isinstance(_yaml(path), dict), f"{path} is not a YAML mapping"


def test_expected_files_exist() -> None:
    prometheus = (PROM_CONFIG, RECORDING, ALERTS, RULE_TESTS)
    for path in (*prometheus, DATASOURCE, DASHBOARD_PROVIDER, DASHBOARD, README):
        assert path.is_file(), path


# --- (b) Prometheus config and rule files -----------------------------------------------------


def test_scrape_config() -> None:
    config = _yaml(PROM_CONFIG)
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "tool-shortlist"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == ["shortlist-1:8080", "shortlist-2:8080"]
    # Paths relative to prometheus.yml, so they resolve both here and under /etc/prometheus/.
    rule_files = config["rule_files"]
    assert all(not Path(f).is_absolute() for f in rule_files)
    assert {(PROM_DIR / f).resolve() for f in rule_files} == {RECORDING.resolve(), ALERTS.resolve()}


@pytest.mark.parametrize("path", [RECORDING, ALERTS], ids=lambda p: p.name)
def test_rule_file_structure(path: Path) -> None:
    doc = _yaml(path)
    assert set(doc) == {"groups"}
    names = [g["name"] for g in doc["groups"]]
    assert len(names) == len(set(names)), f"duplicate group names in {path.name}"
    for group in doc["groups"]:
        assert group["rules"], f"group {group['name']} is empty"
        if "interval" in group:
            assert _DURATION.match(str(group["interval"]))
        for rule in group["rules"]:
            kind = {"record", "alert"} & set(rule)
            assert len(kind) == 1, rule
            assert set(rule) <= RULE_KEYS, f"unknown keys {set(rule) - RULE_KEYS}"
            expr = rule.get("expr")
            assert isinstance(expr, str) and expr.strip(), f"empty expr in {rule}"
            assert _balanced(expr), f"unbalanced brackets in {expr!r}"
            if "for" in rule:
                assert _DURATION.match(str(rule["for"])), f"bad for: {rule['for']!r}"
            if "record" in rule:
                assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["record"])
                assert ":" in rule["record"], "recording rules are named level:metric:operations"
                assert "annotations" not in rule and "for" not in rule


def test_recording_rules() -> None:
    names = [rule["record"] for rule in _rules(RECORDING)]
    assert len(names) == len(set(names))
    assert set(names) >= REQUIRED_RECORDINGS
    assert all("alert" not in r for r in _rules(RECORDING))


def test_alert_rules() -> None:
    alerts = {rule["alert"]: rule for rule in _rules(ALERTS)}
    assert all("record" not in r for r in _rules(ALERTS))
    assert set(alerts) >= REQUIRED_ALERTS
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert annotations.get("summary") and annotations.get("description"), name
        text = annotations["summary"] + annotations["description"]
        assert "$value" in text or "$labels" in text, name
        if name in REGISTRY_ALERTS:
            assert "$labels.registry" in text, name
    assert alerts["ShortlistBoRDropped"]["for"] == "30m"
    assert alerts["ShortlistPresentationRateLow"]["for"] == "30m"
    assert alerts["ShortlistLatencyP99High"]["for"] == "10m"
    assert alerts["ShortlistNotReady"]["for"] == "5m"


@pytest.mark.parametrize("path", [RECORDING, ALERTS], ids=lambda p: p.name)
def test_rules_reference_known_metrics(path: Path) -> None:
    allowed = allowed_names() | set(PROMETHEUS_SERIES)
    for rule in _rules(path):
        used = metric_names(rule["expr"])
        assert used, f"no metric found in {rule['expr']!r}"
        unknown = used - allowed
        assert not unknown, f"{rule.get('record') or rule.get('alert')}: unknown metrics {unknown}"


def test_recording_rules_only_use_earlier_recordings() -> None:
    # Rules in a group run in order; a rule reading a later recording would lag one interval
    # (same group) or see nothing at all until the other group runs.
    defined: set[str] = set()
    for rule in _rules(RECORDING):
        used_recordings = metric_names(rule["expr"]) - set(EXPORTED_METRICS)
        early = used_recordings - defined
        assert not early, f"{rule['record']} uses {early} before they are defined"
        defined.add(rule["record"])


def test_promtool_check_rules() -> None:
    if PROMTOOL is None:
        # Python fallback: the structural and metric-name tests above carry the weight.
        for path in (RECORDING, ALERTS):
            assert all(_balanced(rule["expr"]) for rule in _rules(path))
        return
    output = _promtool("check", "rules", str(RECORDING), str(ALERTS))
    assert output.count("SUCCESS") == 2


def test_promtool_check_config() -> None:
    if PROMTOOL is None:
        config = _yaml(PROM_CONFIG)
        assert _DURATION.match(config["global"]["scrape_interval"])
        for f in config["rule_files"]:
            assert (PROM_DIR / f).is_file(), f
        return
    # Rule files resolve relative to prometheus.yml, the layout of /etc/prometheus/.
    output = _promtool("check", "config", str(PROM_CONFIG))
    assert "is valid prometheus config file syntax" in output


def test_promtool_rule_unit_tests() -> None:
    spec = _yaml(RULE_TESTS)
    for f in spec["rule_files"]:
        assert (RULE_TESTS.parent / f).resolve() in {RECORDING.resolve(), ALERTS.resolve()}
    alert_names = {rule["alert"] for rule in _rules(ALERTS)}
    tested = {case["alertname"] for t in spec["tests"] for case in t.get("alert_rule_test", [])}
    assert tested <= alert_names
    assert tested >= REQUIRED_ALERTS, f"alerts without a unit test: {REQUIRED_ALERTS - tested}"
    if PROMTOOL is None:
        return
    output = _promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert "SUCCESS" in output


# --- Grafana ----------------------------------------------------------------------------------


def test_grafana_provisioning() -> None:
    (ds,) = _yaml(DATASOURCE)["datasources"]
    assert ds["uid"] == "prometheus" and ds["type"] == "prometheus"
    assert ds["url"] == "http://prometheus:9090"
    (provider,) = _yaml(DASHBOARD_PROVIDER)["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def _dashboard() -> dict[str, Any]:
    with DASHBOARD.open() as f:
        dashboard: dict[str, Any] = json.load(f)
    return dashboard


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # panels inside collapsed rows


def _targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def test_dashboard_structure() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "tool-shortlist"
    assert dashboard["schemaVersion"] >= 36
    (var,) = [v for v in dashboard["templating"]["list"] if v["name"] == "registry"]
    query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
    assert query == "label_values(shortlist_registry_tools, registry)"
    assert var["datasource"]["uid"] == "prometheus"

    panels = list(_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles)), "duplicate panel titles"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "prometheus", panel["title"]
            assert panel["targets"], panel["title"]
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
    for panel in panels:
        for target in panel.get("targets", []):
            assert target["expr"].strip(), panel["title"]
            assert target.get("datasource", {"uid": "prometheus"})["uid"] == "prometheus"
    # The panels the runbook in deploy/README.md points at.
    exprs = " ".join(expr for _, expr in _targets(dashboard))
    for needed in (
        "registry_match:shortlist_bor_bits:rate1h",
        "registry_match:shortlist_presentation_rate:rate1h",
        "shortlist_k_bucket",
        "stage:shortlist_request_duration_seconds:p99_5m",
        "stage:shortlist_request_duration_seconds:p50_5m",
        "shortlist_requests_total",
        "shortlist_feedback_total",
        "shortlist_registry_tools",
    ):
        assert needed in exprs, needed


def test_dashboard_references_known_metrics() -> None:
    allowed = allowed_names()
    dashboard = _dashboard()
    for title, expr in _targets(dashboard):
        used = metric_names(expr)
        assert used, f"{title}: no metric found in {expr!r}"
        assert not used - allowed, f"{title}: unknown metrics {used - allowed}"
    for var in dashboard["templating"]["list"]:
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = re.fullmatch(r"label_values\((\w+)\s*,\s*\w+\)", query)
        assert match and match.group(1) in allowed, query


def _as_plain_promql(expr: str) -> str:
    """Grafana's variables replaced by values Prometheus accepts."""
    for var, value in (("$__rate_interval", "1m"), ("$__range", "1h"), ("$__interval", "1m")):
        expr = expr.replace(var, value)
    return re.sub(r"\$\{?registry\}?", ".*", expr)


def test_dashboard_promql_parses(tmp_path: Path) -> None:
    exprs = [_as_plain_promql(expr) for _, expr in _targets(_dashboard())]
    assert all("$" not in e for e in exprs), "unhandled Grafana variable"
    if PROMTOOL is None:
        assert all(_balanced(e) for e in exprs)
        return
    # promtool has no offline query parser: a rule file of the dashboard's queries makes it
    # parse them.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query:{i}", "expr": e} for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    _promtool("check", "rules", str(path))


def test_readme_explains_every_alert() -> None:
    text = README.read_text()
    for rule in _rules(ALERTS):
        assert rule["alert"] in text, f"{rule['alert']} is not described in deploy/README.md"
